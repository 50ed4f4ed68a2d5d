package meterledger

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/stripeapi"
)

// Ingest apart from sending (DESIGN.md "Usage at volume"): a meter
// consumer records each valid event once, deciding its spend cap there,
// and acks its entry; senders (sender.go) send from the ledger. The stream's
// pending entries then hold only what is not yet in the ledger, so a busy
// customer's backlog is rows, never entries another customer waits behind.

// IngestRequest asks to record one event.
type IngestRequest struct {
	Request
	// Stream is the stream the entry came from; Fields its fields, kept
	// so that a refusal is dead-lettered (and replayed) from the ledger.
	Stream string
	Fields map[string]any
}

// Ingested is Ingest's answer for one request.
type Ingested struct {
	// Decision is Queued (recorded now, or a replay reopened it), InLedger
	// (already queued or sending), AlreadyDelivered, AlreadyTerminal,
	// OverCap, OutsideWindow, Conflict, Held or ReplayRefused.
	Decision Decision
	Record   Record
	Reason   string
	Cap      CapState // OverCap: the cap and the use that refused it
}

// Ack reports whether the entry may be acked (after the witness): the
// event is in the ledger for good, whoever sends it.
func (g Ingested) Ack() bool {
	switch g.Decision {
	case Queued, InLedger, AlreadyDelivered, AlreadyTerminal:
		return true
	}
	return false
}

type ingestItem struct {
	i     int
	req   IngestRequest
	key   Key
	row   *Record
	out   Ingested
	count bool // adds the event to its customer's use (a new row, a reopened failed one)
	write bool // insert (row nil) or reopen
	// fields: req.Fields as JSON, as the one-statement path wrote them.
	fields []byte
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type usageKey struct {
	name, sc string
	month    time.Time
}

// Ingest records a batch of events in one transaction: each new event is
// inserted queued (deduplicated by its key: a redelivery finds its row)
// and counted in its customer's use of the meter, under the spend cap
// (the batch's meter_usage rows are locked first, in order, so the fleet's
// ingests never pass a cap together); an operator's replay of a failed or
// parked event queues it again by decideRow's rules. Nothing is sent.
// out[i] answers reqs[i].
func (l *Ledger) Ingest(ctx context.Context, reqs []IngestRequest) ([]Ingested, error) {
	for _, r := range reqs {
		ev := r.Event
		if r.Identifier == "" || len(r.Identifier) > stripeapi.MeterIdentifierMaxLen || ev.EventName == "" ||
			ev.StripeCustomerID == "" || ev.Timestamp.IsZero() || r.Stream == "" {
			return nil, fmt.Errorf("meter ledger: Ingest needs an identifier of 1-%d bytes, a stream, and an event name, "+
				"Stripe customer and timestamp (identifier %q)", stripeapi.MeterIdentifierMaxLen, r.Identifier)
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	need := false
	for _, r := range reqs {
		need = need || !l.ensured(KeyOf(r.Event, r.Identifier).EventTS)
	}
	if need {
		if _, err := l.EnsurePartitions(ctx, now); err != nil {
			return nil, err
		}
	}
	var out []Ingested
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if out, err = l.ingestFast(ctx, reqs, now); !retryable(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ingesting %d meter events: %w", len(reqs), err)
	}
	return out, nil
}

// ingestLocked is the exact path (ingest_fast.go says when it is taken):
// the batch's uses of its meters are locked first, then its rows read and
// decided event by event in (timestamp, identifier) order, each new event
// counted only while its cap allows it.
func (l *Ledger) ingestLocked(ctx context.Context, reqs []IngestRequest, now time.Time) ([]Ingested, error) {
	items := make([]*ingestItem, len(reqs))
	groups := map[usageKey]bool{}
	for i, r := range reqs {
		items[i] = &ingestItem{i: i, req: r, key: KeyOf(r.Event, r.Identifier)}
		groups[usageKey{r.Event.EventName, r.Event.StripeCustomerID, MonthOf(items[i].key.EventTS)}] = true
	}
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()

	// 1. The batch's uses of the meters, locked in order, with their caps.
	gk := make([]usageKey, 0, len(groups))
	for k := range groups {
		gk = append(gk, k)
	}
	slices.SortFunc(gk, func(a, b usageKey) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.sc, b.sc), a.month.Compare(b.month))
	})
	use, err := lockUsage(ctx, tx, gk, now)
	if err != nil {
		return nil, err
	}
	// 2. The rows already there (under those locks, a new event of the
	// same customer and meter cannot be inserted by anyone else meanwhile).
	if err := readRows(ctx, tx, items); err != nil {
		return nil, err
	}
	// 3. Decide.
	first := map[Key]*ingestItem{}
	order := slices.Clone(items)
	slices.SortStableFunc(order, func(a, b *ingestItem) int {
		return cmp.Or(a.key.EventTS.Compare(b.key.EventTS), cmp.Compare(a.key.Identifier, b.key.Identifier), cmp.Compare(a.i, b.i))
	})
	for _, it := range order {
		if f, dup := first[it.key]; dup {
			it.out = Ingested{Decision: InLedger, Reason: "another copy of the event in this batch"}
			if !f.write && f.row == nil {
				it.out = f.out // both refused alike
			}
			continue
		}
		first[it.key] = it
		d, reason := decideRow(now, l.safe, it.req.Request, it.key, it.row)
		it.out = Ingested{Decision: d, Reason: reason}
		if it.row != nil {
			it.out.Record = *it.row
		}
		switch d {
		case Acquired:
			if it.row == nil {
				it.write, it.count = true, true
			} else {
				it.out.Decision = InLedger // queued: a sender has it
			}
		case Reopened:
			it.write, it.count = true, it.row.Status == StatusFailed
		case TakenOver, Busy, Parked, SlotBusy:
			it.out.Decision, it.out.Reason = InLedger, "" // sending: a sender finishes it
		}
		if !it.count {
			continue
		}
		ev := it.req.Event
		u := use[usageKey{ev.EventName, ev.StripeCustomerID, MonthOf(it.key.EventTS)}]
		if u.capped && !u.st.Cap.Allows(u.st.Units, u.st.Events, ev.Value) {
			it.write, it.count = false, false
			it.out = Ingested{Decision: OverCap, Cap: u.st, Reason: capReason(u.st, ev.StripeCustomerID, ev.Value), Record: it.out.Record}
			continue
		}
		u.st.Units += ev.Value
		u.st.Events++
	}
	// 4. Write: new rows queued, replays reopened, the use counted.
	written, err := l.writeIngest(ctx, tx, items, now)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	out := make([]Ingested, len(items))
	for _, it := range items {
		if it.write {
			rec, ok := written[it.key]
			if !ok {
				return nil, fmt.Errorf("meter event %s was not written", it.key)
			}
			it.out = Ingested{Decision: Queued, Record: rec}
		}
		out[it.i] = it.out
	}
	return out, nil
}

type lockedUse struct {
	st     CapState
	capped bool
}

// lockUsage locks (making them where missing) the meter_usage rows of gk,
// in gk's order, and reads them with the cap that applies to each.
func lockUsage(ctx context.Context, tx pgx.Tx, gk []usageKey, now time.Time) (map[usageKey]*lockedUse, error) {
	names, scs, months := make([]string, len(gk)), make([]string, len(gk)), make([]time.Time, len(gk))
	for i, k := range gk {
		names[i], scs[i], months[i] = k.name, k.sc, k.month
	}
	rows, err := tx.Query(ctx, `WITH g AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::date[]) WITH ORDINALITY AS g(name, sc, month, i)
		), locked AS (
			INSERT INTO {schema}.meter_usage AS u (event_name, stripe_customer_id, month, units, events, updated_at)
			SELECT g.name, g.sc, g.month, 0, 0, $4 FROM g ORDER BY g.i
			ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE SET units = u.units
			RETURNING u.event_name, u.stripe_customer_id, u.month, u.units, u.events
		)
		SELECT l.event_name, l.stripe_customer_id, l.month, l.units, l.events, c.stripe_customer_id, c.month, c.cap, c.counts
		FROM locked l LEFT JOIN LATERAL (SELECT * `+applicableSQL("{schema}.meter_caps", "l.event_name", "l.stripe_customer_id", "l.month")+`) c ON true`,
		names, scs, months, now)
	if err != nil {
		return nil, fmt.Errorf("locking the meters' use: %w", err)
	}
	defer rows.Close()
	out := map[usageKey]*lockedUse{}
	for rows.Next() {
		var k usageKey
		var u lockedUse
		var capCus, capMonth, capCounts *string
		var capUnits *int64
		if err := rows.Scan(&k.name, &k.sc, &k.month, &u.st.Units, &u.st.Events, &capCus, &capMonth, &capUnits, &capCounts); err != nil {
			return nil, fmt.Errorf("reading the meters' use: %w", err)
		}
		k.month = k.month.UTC()
		u.st.Month = k.month
		if capUnits != nil {
			u.capped = true
			u.st.Cap = Cap{EventName: k.name, StripeCustomerID: *capCus, Month: *capMonth, Cap: *capUnits, Counts: Counts(*capCounts)}
		}
		out[k] = &u
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the meters' use: %w", err)
	}
	for _, k := range gk {
		if out[k] == nil {
			return nil, fmt.Errorf("meter ledger: no use row for %s/%s %s", k.name, k.sc, k.month.Format("2006-01"))
		}
	}
	return out, nil
}

func readRows(ctx context.Context, q querier, items []*ingestItem) error {
	ts, ids := make([]time.Time, len(items)), make([]string, len(items))
	for i, it := range items {
		ts[i], ids[i] = it.key.EventTS, it.key.Identifier
	}
	// LATERAL: one primary-key probe per event, whatever the partitions'
	// statistics say (a hash join over a whole day's partition otherwise).
	rows, err := q.Query(ctx, `SELECT `+recordCols+`, r.i
		FROM unnest($1::timestamptz[], $2::text[]) WITH ORDINALITY AS r(ts, id, i)
		CROSS JOIN LATERAL (SELECT * FROM {schema}.meter_events m WHERE m.event_ts = r.ts AND m.identifier = r.id) m`, ts, ids)
	if err != nil {
		return fmt.Errorf("reading %d meter events: %w", len(items), err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		r, _, err := scanRecord(rows, &i)
		if err != nil {
			return fmt.Errorf("scanning meter event: %w", err)
		}
		items[i-1].row = &r
	}
	return rows.Err()
}

// writeIngest inserts the new rows queued, reopens the replayed ones
// queued, counts the use of both, and adopts rows of the batch that a
// per-event consumer left sending (they get the stream and fields).
func (l *Ledger) writeIngest(ctx context.Context, tx pgx.Tx, items []*ingestItem, now time.Time) (map[Key]Record, error) {
	var ops []int32
	var ts []time.Time
	var ids, names, scs, custs, msgs, streams, overrides []string
	var vals []int64
	var fields []string
	var cnts []bool
	for _, it := range items {
		adopt := it.out.Decision == InLedger && it.row != nil && it.row.Stream == ""
		if !it.write && !adopt {
			continue
		}
		ev := it.req.Event
		op := int32(1) // insert
		switch {
		case adopt:
			op = 3
		case it.row != nil:
			op = 2 // reopen
		}
		f, err := json.Marshal(it.req.Fields)
		if err != nil {
			return nil, fmt.Errorf("encoding the fields of %s: %w", it.key, err)
		}
		ops, ts, ids = append(ops, op), append(ts, it.key.EventTS), append(ids, it.key.Identifier)
		names, scs, custs = append(names, ev.EventName), append(scs, ev.StripeCustomerID), append(custs, ev.CustomerID)
		msgs, streams, overrides = append(msgs, it.req.MessageID), append(streams, it.req.Stream), append(overrides, it.req.Override)
		vals, fields, cnts = append(vals, ev.Value), append(fields, string(f)), append(cnts, it.count)
	}
	out := map[Key]Record{}
	if len(ops) == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, ingestSQL, ops, ts, ids, names, scs, custs, vals, msgs, streams, fields, overrides, cnts, now)
	if err != nil {
		return nil, fmt.Errorf("recording %d meter events: %w", len(ops), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, _, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning meter event: %w", err)
		}
		out[r.Key] = r
	}
	return out, rows.Err()
}

// ingestSQL: op 1 inserts a queued row, 2 reopens a failed or parked row
// queued (a replay; decideRow's rules for its first attempt), 3 adopts a
// per-event row still sending; the use of the counted ones is added.
var ingestSQL = `
WITH a AS (
	SELECT *, ` + monthSQL("a.ts") + ` AS month
	FROM unnest($1::int[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[],
		$9::text[], $10::text[], $11::text[], $12::bool[]) AS a(op, ts, id, name, sc, cust, val, msg, stream, fields, reason, cnt)
), ins AS (
	INSERT INTO {schema}.meter_events AS m (event_ts, identifier, event_name, stripe_customer_id, customer_id, value, status,
		first_sent_at, attempts, epoch, stream_message_id, entry_second, created_at, stream, fields)
	SELECT a.ts, a.id, a.name, a.sc, nullif(a.cust, ''), a.val, 'queued', $13, 1, ` + firstEpoch + `,
		` + entryValuesSQL("nullif(a.msg, '')") + `, $13, a.stream, a.fields::jsonb
	FROM a WHERE a.op = 1 ORDER BY a.ts, a.id
	ON CONFLICT DO NOTHING RETURNING m.*
), reopen AS (
	UPDATE {schema}.meter_events m SET status = 'queued', event_name = a.name, stripe_customer_id = a.sc,
		customer_id = coalesce(nullif(a.cust, ''), m.customer_id), value = a.val,
		first_sent_at = CASE WHEN a.reason = '' AND m.settled_at IS NULL AND (m.status = 'parked' OR m.outcome_unknown)
			THEN m.first_sent_at ELSE $13 END,
		outcome_unknown = a.reason = '' AND m.settled_at IS NULL AND (m.status = 'parked' OR m.outcome_unknown),
		replay_override = coalesce(nullif(a.reason, ''), m.replay_override), settled_at = NULL, settled_by = NULL, settle_reason = NULL,
		epoch = ` + nextEpoch + `, delivered_at = NULL, last_error = NULL,
		` + entrySetSQL("coalesce(nullif(a.msg, ''), m.stream_message_id)") + `, stream = a.stream, fields = a.fields::jsonb
	FROM a
	WHERE a.op = 2 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($2) AND m.status IN ('failed', 'parked')
	RETURNING m.*
), adopt AS (
	UPDATE {schema}.meter_events m SET stream = a.stream, fields = a.fields::jsonb
	FROM a
	WHERE a.op = 3 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($2) AND m.stream IS NULL
), counted AS (
	UPDATE {schema}.meter_usage u SET units = u.units + g.units, events = u.events + g.events, updated_at = $13
	FROM (SELECT w.event_name, w.stripe_customer_id, ` + monthSQL("w.event_ts") + ` AS month, sum(w.value) AS units, count(*) AS events
		FROM (SELECT * FROM ins UNION ALL SELECT * FROM reopen) w
		JOIN a ON a.ts = w.event_ts AND a.id = w.identifier AND a.cnt
		GROUP BY 1, 2, 3) g
	WHERE u.event_name = g.event_name AND u.stripe_customer_id = g.stripe_customer_id AND u.month = g.month
)
SELECT ` + cols("w") + ` FROM (SELECT * FROM ins UNION ALL SELECT * FROM reopen) w`
