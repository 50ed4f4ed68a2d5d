package meterledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pelguard/pelguard/event"
)

// Unsent lists up to limit events of stream to send next, at most one per
// (customer, meter) and only where that meter's slot is free or expired:
// per customer-meter, an event left sending by a holder that is gone (its
// lease expired: an unknown outcome to take over) before its oldest queued
// one; across customer-meters, the oldest first. So every customer with
// something to send gets a call each round, however much one of them has
// queued. The rows are candidates: Reserve decides (and may refuse) each.
func (l *Ledger) Unsent(ctx context.Context, stream string, limit int) ([]Record, error) {
	return l.Candidates(ctx, stream, limit, nil, time.Time{}, nil)
}

// ListFrom is where a sender's listing of candidates stands.
type ListFrom struct {
	// Floor: no unsent event of the stream is older (UnsentFloor; zero:
	// unknown, every partition is read). Only partitions from its day on
	// are planned and read.
	Floor time.Time
	// After is the round-robin cursor over customer-meters (customer, meter):
	// each listing also takes the next customer-meters after it in key
	// order, so a customer-meter with work is listed within a bounded
	// number of listings however much older work others have queued.
	After [2]string
	// Hot are customer-meters the sender sent for lately (a busy
	// customer): each is listed whenever it has a ready event, ahead of
	// older work of others. Without it a busy customer that caught up
	// waited behind every older quiet event for a slot: at volume it went
	// 25 s without a call while the quiet backlog drained.
	Hot []MeterKey
}

// listWindow is how many queued rows a listing reads at most, in
// timestamp order and in key order after the cursor: bounded work
// however long the backlog.
const listWindow = 500

// Candidates is Unsent where the queued events of the aggregated meters
// count only once their bucket is ready to form at watermark (the group's
// ingest watermark, FormAggregate's rule): a customer-meter whose queued
// events are all of a bucket still open is not a candidate, so a sender
// never spends a transaction on it. It reads a bounded window of the
// backlog, never all of it: the oldest queued events in timestamp order,
// the customer-meters after from.After in key order (then from.After
// moves on, and wraps at the end), from.Hot's customer-meters, and events
// left sending by a holder that is gone; so from.Hot's go first, then the
// oldest, and every customer-meter with work comes up within
// (customer-meters with work)/listWindow listings.
func (l *Ledger) Candidates(ctx context.Context, stream string, limit int, aggregated []string, watermark time.Time,
	from *ListFrom) ([]Record, error) {
	now := l.clock.Now().UTC()
	if aggregated == nil {
		aggregated = []string{}
	}
	if from == nil {
		from = &ListFrom{}
	}
	floor := from.Floor.UTC().Truncate(24 * time.Hour) // partitions are days
	ready := watermark.Unix()
	rows, err := l.pool.Query(ctx, `SELECT m.stripe_customer_id, m.event_name FROM {schema}.meter_events m
		WHERE m.status = 'queued' AND m.stream = $1 AND m.event_ts >= $2 AND (m.stripe_customer_id, m.event_name) > ($3, $4)
		ORDER BY m.stripe_customer_id, m.event_name, m.event_ts LIMIT $5`, stream, floor, from.After[0], from.After[1], listWindow)
	if err != nil {
		return nil, fmt.Errorf("listing unsent meter events: %w", err)
	}
	var keyC, keyM []string
	n := 0
	for rows.Next() {
		var c, m string
		if err := rows.Scan(&c, &m); err != nil {
			rows.Close()
			return nil, fmt.Errorf("listing unsent meter events: %w", err)
		}
		n++
		if k := len(keyC); k == 0 || keyC[k-1] != c || keyM[k-1] != m {
			keyC, keyM = append(keyC, c), append(keyM, m)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing unsent meter events: %w", err)
	}
	// Each key costs the read below a lookup: no more keys than the
	// listing returns at most; the cursor moves on past the last kept.
	cut := limit > 0 && len(keyC) > limit
	if cut {
		keyC, keyM = keyC[:limit], keyM[:limit]
	}
	if k := len(keyC); (n == listWindow || cut) && k > 0 {
		from.After = [2]string{keyC[k-1], keyM[k-1]}
	} else {
		from.After = [2]string{} // the end: from the start next time
	}
	// Each customer-meter's oldest is read by its key's index
	// (meter_events_queued_idx): ordered by the whole key, so a planner
	// misled by stale statistics on a fast-filling table (it takes a
	// freshly ingested partition for nearly empty) never walks the
	// timestamp index and filters every customer's rows instead.
	hotC, hotM := make([]string, len(from.Hot)), make([]string, len(from.Hot))
	for i, k := range from.Hot {
		hotC[i], hotM[i] = k.StripeCustomerID, k.EventName
	}
	keyC, keyM = append(keyC, hotC...), append(keyM, hotM...)
	readySQL := `(m.event_name <> ALL($4::text[]) OR m.event_ts < to_timestamp($5::bigint) AND ` + bucketSQL("m") + ` < $5::bigint)`
	rows, err = l.pool.Query(ctx, `WITH a AS (
			SELECT * FROM {schema}.meter_events m WHERE m.status = 'queued' AND m.stream = $1 AND m.event_ts >= $6 AND `+readySQL+`
			ORDER BY m.event_ts LIMIT $9
		), b AS (
			SELECT q.* FROM unnest($7::text[], $8::text[]) AS k(sc, name)
			CROSS JOIN LATERAL (SELECT * FROM {schema}.meter_events m WHERE m.status = 'queued' AND m.stream = $1
				AND m.stripe_customer_id = k.sc AND m.event_name = k.name AND m.event_ts >= $6 AND `+readySQL+`
				ORDER BY m.stripe_customer_id, m.event_name, m.event_ts LIMIT 1) q
		), s AS (
			SELECT * FROM {schema}.meter_events m WHERE m.status = 'sending' AND m.stream = $1 AND m.aggregate IS NULL
				AND m.event_ts >= $6 AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= $2)
			ORDER BY m.event_ts LIMIT $9
		), c AS (
			SELECT DISTINCT ON (m.stripe_customer_id, m.event_name) m.*
			FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM s) m
			ORDER BY m.stripe_customer_id, m.event_name, m.status = 'queued', m.event_ts, m.identifier
		)
		SELECT `+recordCols+` FROM c m
		LEFT JOIN {schema}.meter_inflight s ON s.stripe_customer_id = m.stripe_customer_id AND s.event_name = m.event_name
		WHERE s.token IS NULL OR s.expires_at <= $2
		ORDER BY (m.stripe_customer_id, m.event_name) IN (SELECT * FROM unnest($10::text[], $11::text[])) DESC, m.event_ts
		LIMIT $3`, stream, now, limit, aggregated, ready, floor, keyC, keyM, listWindow, hotC, hotM)
	if err != nil {
		return nil, fmt.Errorf("listing unsent meter events: %w", err)
	}
	return collectRecords(rows)
}

// UnsentFloor is the timestamp of stream's oldest event not yet sent
// (queued or sending), or now less an hour when it has none: a sender's
// ListFrom.Floor. An aggregate's members in flight count by its second
// (no later than any member's timestamp), read from the aggregates: by
// the events' own rows it walked the primary key past every delivered
// row before them, at volume a third of a second each time.
func (l *Ledger) UnsentFloor(ctx context.Context, stream string) (time.Time, error) {
	var t *time.Time
	if err := l.pool.QueryRow(ctx, `SELECT least(
			(SELECT min(event_ts) FROM {schema}.meter_events WHERE status = 'queued' AND stream = $1),
			(SELECT min(event_ts) FROM {schema}.meter_events WHERE status = 'sending' AND aggregate IS NULL AND stream = $1),
			(SELECT min(second) FROM {schema}.meter_aggregates WHERE status = 'sending' AND stream = $1))`, stream).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("finding the oldest unsent meter event: %w", err)
	}
	if t == nil {
		return l.clock.Now().UTC().Add(-time.Hour), nil
	}
	return t.UTC(), nil
}

func collectRecords(rows pgx.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, _, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning meter event: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Backlog counts stream's events not yet sent (queued) and those sending.
func (l *Ledger) Backlog(ctx context.Context, stream string) (queued, sending int64, err error) {
	err = l.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'sending')
		FROM {schema}.meter_events WHERE status IN ('queued', 'sending') AND stream = $1`, stream).Scan(&queued, &sending)
	if err != nil {
		return 0, 0, fmt.Errorf("counting unsent meter events: %w", err)
	}
	return queued, sending, nil
}

// EventOf is the event a row records, for a send from the ledger.
func EventOf(r Record) event.MeterEvent {
	return event.MeterEvent{EventName: r.EventName, CustomerID: r.CustomerID, StripeCustomerID: r.StripeCustomerID,
		Value: r.Value, Timestamp: r.EventTS}
}

// FieldsOf is the row's copy of its stream entry's fields (nil: none).
func FieldsOf(r Record) map[string]any {
	if len(r.Fields) == 0 {
		return nil
	}
	var f map[string]any
	if json.Unmarshal([]byte(r.Fields), &f) != nil {
		return nil
	}
	return f
}

// ErrPerEventFenced: the ledger sends meter events from ingest
// (meter_send_fence); a per-event consumer may not send on it.
var ErrPerEventFenced = errors.New("meter events on this ledger are sent from the ledger after ingest: a per-event consumer may not send; " +
	"run every meter consumer with --send-from-ledger")

// FenceSends records, once, that this ledger's meter events are sent from
// ingest: from then on a per-event consumer's new rows are refused (the
// trigger of meter_send_fence), old binaries included; rows already sending
// finish under their identifiers. by names who fenced it.
func (l *Ledger) FenceSends(ctx context.Context, by string) error {
	if _, err := l.pool.Exec(ctx, `INSERT INTO {schema}.meter_send_fence (since, by_name) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		l.clock.Now().UTC(), by); err != nil {
		return fmt.Errorf("fencing per-event meter sends: %w", err)
	}
	return nil
}

// SendsFenced reports whether FenceSends was called on this ledger, and when.
func (l *Ledger) SendsFenced(ctx context.Context) (bool, time.Time, error) {
	var since time.Time
	err := l.pool.QueryRow(ctx, `SELECT since FROM {schema}.meter_send_fence`).Scan(&since)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, fmt.Errorf("reading the meter send fence: %w", err)
	}
	return true, since.UTC(), nil
}

// IsPerEventFenced reports the trigger's refusal of a per-event row.
func IsPerEventFenced(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "P0001" && pe.Hint == "meter_send_fence"
}
