package meterledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The usage repair's writes (DESIGN.md "Usage after a ledger rollback"): a
// ledger that lost commits has lost delivered (and parked) rows whose
// events Stripe counts, and their share of meter_usage. Stripe has no
// listing of single meter events to rebuild them from, so the repair
// restores them from what pelguard recorded outside Postgres before each
// XACK (internal/meterwitness), and parks the events a rollback may have
// lost that it cannot prove either way.

// Restored is one meter event as a repair restores it.
type Restored struct {
	Key
	EventName        string
	StripeCustomerID string
	CustomerID       string
	Value            int64
	// Status is StatusDelivered, StatusParked or StatusQueued (ingested and
	// acked, maybe sent since: restored queued, of unknown outcome, its
	// first attempt at FirstSentAt — the ingest — so a sender re-sends it
	// under its identifier within the safe window and parks it past; an
	// aggregate meter's row is formed again into its bucket's aggregate,
	// the same members under the same identifier, never sent on its own).
	// A member of a witnessed aggregate is restored sending under it.
	Status Status
	// Stream is the stream the event was ingested from (queued ones: the
	// senders of that stream finish it).
	Stream string
	// Aggregate: a queued event witnessed as a member of this aggregate
	// (sent, or about to be, before the rollback): restored sending under
	// it, never on its own (RestoreAggregate restores the aggregate).
	Aggregate string
	// FirstSentAt is the first attempt as recorded; zero: now. The usage
	// repair parks an event whose first attempt it cannot know with the
	// event's own time, so that a replay is refused until it is settled
	// (zero would let one through for the safe window).
	FirstSentAt time.Time
	// Reason: why a parked event is parked (last_error).
	Reason    string
	MessageID string
}

// RestoreOutcome is what Restore did with one event.
type RestoreOutcome string

// Restore's outcomes.
const (
	// RestoreInserted: the row was missing; it is back, and its value
	// counts again in its customer's use of the meter (meter_usage).
	RestoreInserted RestoreOutcome = "inserted"
	// RestoreRepaired: the rollback had taken the row back to sending (or
	// a re-send since parked it): it records the witnessed outcome, under a
	// new epoch (a holder from before can no longer finish it). Its use was
	// already counted.
	RestoreRepaired RestoreOutcome = "repaired"
	// RestoreUnchanged: the row already says what was witnessed (or, for an
	// event parked by the repair, the ledger has a row: the consumers
	// decide it as any other).
	RestoreUnchanged RestoreOutcome = "unchanged"
	// RestoreConflict: the row records another meter, customer or value,
	// or says Stripe refused an event witnessed delivered: left as it is;
	// Detail says what a person must look at.
	RestoreConflict RestoreOutcome = "conflict"
)

// RestoreResult answers one event of Restore.
type RestoreResult struct {
	Outcome RestoreOutcome
	Before  Status // the row's status before (empty: none)
	Detail  string
}

// Restore writes evs back into meter_events in one statement (one
// transaction): a missing row is inserted with its witnessed status and its
// value added to its customer's meter_usage; when repairRows is set, a row
// the rollback took back to sending is given the witnessed status (a
// delivered witness also wins over a parked row: Stripe accepted it), under
// a new epoch. Rows that disagree with the witness on the event are left
// as they are. Every write is idempotent: a second Restore changes nothing.
// The caller makes the partitions (EnsurePartitions).
func (l *Ledger) Restore(ctx context.Context, evs []Restored, repairRows bool) ([]RestoreResult, error) {
	out := make([]RestoreResult, len(evs))
	if len(evs) == 0 {
		return out, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	n := len(evs)
	ts, first := make([]time.Time, n), make([]time.Time, n)
	ids, names, scs, custs, sts, msgs, reasons := make([]string, n), make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n)
	vals := make([]int64, n)
	streams, aggs := make([]string, n), make([]string, n)
	for i, e := range evs {
		streams[i], aggs[i] = e.Stream, e.Aggregate
		if e.Identifier == "" || e.EventName == "" || e.StripeCustomerID == "" || e.EventTS.IsZero() ||
			(e.Status != StatusDelivered && e.Status != StatusParked && e.Status != StatusQueued) || (e.Status == StatusParked && e.Reason == "") {
			return nil, fmt.Errorf("meter ledger: restoring %s: an identifier, event name, Stripe customer, timestamp and a status "+
				"delivered, parked (with its reason) or queued are required", e.Key)
		}
		ts[i], ids[i], names[i], scs[i], custs[i], vals[i] = e.EventTS.UTC().Truncate(time.Millisecond), e.Identifier, e.EventName,
			e.StripeCustomerID, e.CustomerID, e.Value
		sts[i], msgs[i], reasons[i], first[i] = string(e.Status), e.MessageID, e.Reason, e.FirstSentAt
		if first[i].IsZero() {
			first[i] = now
		}
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if err = l.restore(ctx, out, ts, ids, names, scs, custs, vals, sts, first, msgs, reasons, streams, aggs, now, repairRows); !retryable(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("restoring %d meter events: %w", n, err)
	}
	return out, nil
}

func (l *Ledger) restore(ctx context.Context, out []RestoreResult, ts []time.Time, ids, names, scs, custs []string, vals []int64,
	sts []string, first []time.Time, msgs, reasons, streams, aggs []string, now time.Time, repairRows bool) error {
	rows, err := l.pool.Query(ctx, restoreSQL, ts, ids, names, scs, custs, vals, sts, first, msgs, reasons, now, repairRows, streams, aggs)
	if err != nil {
		return err
	}
	var i int
	var inserted, repaired bool
	var before, name, sc string
	var val int64
	_, err = pgx.ForEachRow(rows, []any{&i, &inserted, &repaired, &before, &name, &sc, &val}, func() error {
		r := &out[i-1]
		*r = RestoreResult{Before: Status(before)}
		st := Status(sts[i-1])
		switch {
		case inserted:
			r.Outcome = RestoreInserted
		case repaired:
			r.Outcome = RestoreRepaired
		case before == "":
			// Inserted meanwhile by someone else, or a copy of the event
			// earlier in the batch: what is there now is theirs to decide.
			r.Outcome = RestoreUnchanged
		case name != names[i-1] || sc != scs[i-1] || val != vals[i-1]:
			r.Outcome, r.Detail = RestoreConflict, fmt.Sprintf("identifier %s is recorded for %s/%s value %d; %s %s/%s value %d",
				ids[i-1], name, sc, val, st, names[i-1], scs[i-1], vals[i-1])
		case st == StatusDelivered && r.Before == StatusFailed:
			r.Outcome, r.Detail = RestoreConflict, fmt.Sprintf("identifier %s is recorded failed (Stripe refused it), "+
				"but it was witnessed delivered: left failed; compare Stripe's event summaries", ids[i-1])
		default:
			r.Outcome = RestoreUnchanged
		}
		return nil
	})
	return err
}

// restoreSQL: $1… the events, $7 the status to restore, $8 the first
// attempt, $11 now, $12 whether existing rows are repaired. The final
// SELECT reads the rows as they were before the statement (its snapshot):
// Before.
var restoreSQL = `
WITH a AS (
	SELECT *, ` + monthSQL("a.ts") + ` AS month
	FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],
		$8::timestamptz[], $9::text[], $10::text[], $13::text[], $14::text[]) WITH ORDINALITY AS a(ts, id, name, sc, cust, val, st, first, msg, reason, stream, agg, i)
), ins AS (
	INSERT INTO {schema}.meter_events (event_ts, identifier, event_name, stripe_customer_id, customer_id, value, status,
		first_sent_at, attempts, epoch, delivered_at, last_error, stream_message_id, entry_second, created_at, outcome_unknown, stream,
		aggregate)
	SELECT DISTINCT ON (a.ts, a.id) a.ts, a.id, a.name, a.sc, nullif(a.cust, ''), a.val,
		CASE WHEN a.st = 'queued' AND a.agg <> '' THEN 'sending' ELSE a.st END, a.first, 1, ` + firstEpoch + `,
		CASE WHEN a.st = 'delivered' THEN $11::timestamptz END, CASE WHEN a.st = 'parked' THEN a.reason END,
		` + entryValuesSQL("nullif(a.msg, '')") + `, $11, a.st = 'queued', nullif(a.stream, ''), nullif(a.agg, '')
	FROM a ORDER BY a.ts, a.id, a.i
	ON CONFLICT DO NOTHING
	RETURNING event_ts, identifier, event_name, stripe_customer_id, value
), used AS (
	-- The inserted rows count again in their customers' use of the meter
	-- (sending, delivered and parked rows count; the failover lost their
	-- share with them).
	INSERT INTO {schema}.meter_usage AS u (event_name, stripe_customer_id, month, units, events, updated_at)
	SELECT event_name, stripe_customer_id, ` + monthSQL("event_ts") + `, sum(value), count(*), $11 FROM ins GROUP BY 1, 2, 3
	ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE
		SET units = u.units + EXCLUDED.units, events = u.events + EXCLUDED.events, updated_at = EXCLUDED.updated_at
), fix AS (
	-- A queued witness of a row the rollback left queued: it may have
	-- been sent since (that row lost): of unknown outcome since its ingest
	-- (re-sent within the safe window, parked past it).
	UPDATE {schema}.meter_events m SET status = CASE WHEN a.st = 'queued' AND a.agg <> '' THEN 'sending' WHEN a.st = 'queued' THEN 'queued' ELSE a.st END,
		aggregate = CASE WHEN a.st = 'queued' AND a.agg <> '' THEN a.agg ELSE m.aggregate END,
		epoch = ` + nextEpoch + `, lease_owner = NULL, lease_expires_at = NULL,
		delivered_at = CASE WHEN a.st = 'delivered' THEN $11::timestamptz END,
		last_error = CASE WHEN a.st IN ('delivered', 'queued') THEN NULL ELSE a.reason END,
		outcome_unknown = m.outcome_unknown OR a.st = 'queued',
		first_sent_at = CASE WHEN a.st = 'queued' THEN least(m.first_sent_at, a.first) ELSE m.first_sent_at END
	FROM a
	WHERE $12 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($1)
		AND m.event_name = a.name AND m.stripe_customer_id = a.sc AND m.value = a.val
		AND (a.st <> 'queued' AND (m.status IN ('sending', 'queued') OR (a.st = 'delivered' AND m.status = 'parked'))
			OR a.st = 'queued' AND m.status = 'queued' AND (NOT m.outcome_unknown OR a.agg <> ''))
	RETURNING m.event_ts, m.identifier
)
SELECT a.i::int, EXISTS (SELECT 1 FROM ins WHERE ins.event_ts = a.ts AND ins.identifier = a.id)
		AND a.i = (SELECT min(b.i) FROM a b WHERE b.ts = a.ts AND b.id = a.id),
	EXISTS (SELECT 1 FROM fix WHERE fix.event_ts = a.ts AND fix.identifier = a.id),
	coalesce(m.status, ''), coalesce(m.event_name, ''), coalesce(m.stripe_customer_id, ''), coalesce(m.value, 0)
FROM a LEFT JOIN {schema}.meter_events m ON m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($1)`

// LedgerID is the ledger's name (ledger_fence.ledger_id): what Redis keys
// that witness this ledger are scoped by.
func (l *Ledger) LedgerID(ctx context.Context) (string, error) {
	var id string
	if err := l.pool.QueryRow(ctx, `SELECT ledger_id FROM {schema}.ledger_fence`).Scan(&id); err != nil {
		return "", fmt.Errorf("reading the ledger's id: %w", err)
	}
	return id, nil
}

// Now is the ledger's clock.
func (l *Ledger) Now() time.Time { return l.clock.Now() }

// RestoreAggregate writes back an aggregate witnessed before its first
// call (identifier, value and members as witnessed) when the ledger lost
// it and some member is still sending under it (Restore attached them):
// sending, of unknown outcome since firstSentAt, so a sender re-sends it
// under the same identifier within the safe window and parks it with its
// members past it. It reports whether the row was inserted.
func (l *Ledger) RestoreAggregate(ctx context.Context, a Aggregate) (bool, error) {
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	tag, err := l.pool.Exec(ctx, `INSERT INTO {schema}.meter_aggregates (identifier, stream, event_name, stripe_customer_id, second, value,
			members, digest, status, first_sent_at, outcome_unknown, epoch, created_at, arrival_second)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'sending', $9, true, `+firstEpoch+`, $10,
			(SELECT max(`+bucketSQL("m")+`) FROM {schema}.meter_events m WHERE m.aggregate = $1)
		WHERE EXISTS (SELECT 1 FROM {schema}.meter_events WHERE aggregate = $1 AND status = 'sending')
		ON CONFLICT DO NOTHING`, a.Identifier, a.Stream, a.EventName, a.StripeCustomerID, a.Second, a.Value, a.Members, a.Digest,
		a.FirstSentAt, now)
	if err != nil {
		return false, fmt.Errorf("restoring meter aggregate %s: %w", a.Identifier, err)
	}
	return tag.RowsAffected() == 1, nil
}
