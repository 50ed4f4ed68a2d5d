package meterledger

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	// firstEpoch is a new row's epoch, nextEpoch a takeover's: above the
	// ledger's epoch floor (raised past every epoch a lost history could
	// have handed out), as billing_records' are.
	firstEpoch = `(` + ledger.EpochFloorSQL + ` + 1)`
	nextEpoch  = `(greatest(m.epoch, ` + ledger.EpochFloorSQL + `) + 1)`
)

// Reserve decides a batch of events (a consumer's XREADGROUP page) in two
// statements: one reads every row and slot, the second writes every
// decision (new rows, takeovers, parks, slots; and the witness when it
// parks). Each statement is a transaction of its own, and the second
// checks that nothing it decided from changed (the row's epoch and lease,
// the slot's grant): an event whose state moved in between is answered
// Busy or SlotBusy, never sent twice. claims[i] answers reqs[i].
//
// Only Acquired and TakenOver may send; their Hold goes to Finish, and to
// ExtendMany until then. Stripe's one-call-per-customer-per-meter rule: of
// the events of one customer and meter, at most one holds the slot at a
// time, here or anywhere in the fleet; the others are SlotBusy.
func (l *Ledger) Reserve(ctx context.Context, reqs []Request) ([]Claim, error) {
	for _, r := range reqs {
		ev := r.Event
		if r.Owner == "" || r.Lease <= 0 || r.Identifier == "" || len(r.Identifier) > stripeapi.MeterIdentifierMaxLen ||
			ev.EventName == "" || ev.StripeCustomerID == "" || ev.Timestamp.IsZero() {
			return nil, fmt.Errorf("meter ledger: Reserve needs an owner, a positive lease, an identifier of 1-%d bytes "+
				"and an event name, Stripe customer and timestamp (identifier %q)", stripeapi.MeterIdentifierMaxLen, r.Identifier)
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	claims, err := l.reserve(ctx, reqs, now)
	if retryable(err) {
		// A deadlock between two batches' slot locks, or a partition that
		// went missing: decide again from a fresh read, once.
		claims, err = l.reserve(ctx, reqs, now)
	}
	return claims, err
}

func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001" || noPartition(pe))
}

// noPartition: a row that no partition takes (23514 without a constraint).
func noPartition(pe *pgconn.PgError) bool { return pe.Code == "23514" && pe.ConstraintName == "" }

func (l *Ledger) reserve(ctx context.Context, reqs []Request, now time.Time) ([]Claim, error) {
	items, err := l.read(ctx, reqs)
	if err != nil {
		return nil, err
	}
	l.decide(now, items)
	writes, needParts := 0, false
	for _, it := range items {
		if it.op != opNone {
			writes++
		}
		needParts = needParts || (it.op == opInsert && !l.ensured(it.key.EventTS))
	}
	if writes > 0 {
		if needParts {
			if _, err := l.EnsurePartitions(ctx, now); err != nil {
				return nil, err
			}
		}
		if err := l.write(ctx, items, now); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && noPartition(pe) {
				l.forgetPartitions()
			}
			return nil, err
		}
	}
	claims := make([]Claim, len(items))
	for _, it := range items {
		claims[it.i] = it.claim
	}
	return claims, nil
}

// decide makes every item's decision and write plan from what read found.
func (l *Ledger) decide(now time.Time, items []*item) {
	for _, it := range items {
		it.claim.Decision, it.claim.Reason = decideRow(now, l.safe, it.req, it.key, it.row)
		if it.row != nil {
			it.claim.Record = *it.row
		}
		if it.capped && it.counts() && !it.use.Cap.Allows(it.use.Units, it.use.Events, it.req.Event.Value) {
			it.claim = Claim{Decision: OverCap, Record: it.claim.Record, Cap: it.use,
				Reason: capReason(it.use, it.req.Event.StripeCustomerID, it.req.Event.Value)}
		}
	}
	plan(now, items, newToken)
}

func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}

// read loads every request's row and its customer's meter slot.
func (l *Ledger) read(ctx context.Context, reqs []Request) ([]*item, error) {
	n := len(reqs)
	items := make([]*item, n)
	ts, ids, scs, names := make([]time.Time, n), make([]string, n), make([]string, n), make([]string, n)
	for i, r := range reqs {
		items[i] = &item{i: i, req: r, key: KeyOf(r.Event, r.Identifier)}
		ts[i], ids[i], scs[i], names[i] = items[i].key.EventTS, r.Identifier, r.Event.StripeCustomerID, r.Event.EventName
	}
	// The caps of the batch's meters are read once (most meters have
	// none); a customer's use only where a cap applies.
	rows, err := l.pool.Query(ctx, `WITH caps AS MATERIALIZED (
			SELECT * FROM {schema}.meter_caps WHERE event_name = ANY($4)
		)
		SELECT `+recordCols+`,
			coalesce(s.identifier, ''), coalesce(s.owner, ''), s.expires_at, coalesce(s.token, 0), r.i,
			coalesce(u.units, 0), coalesce(u.events, 0), c.stripe_customer_id, c.month, c.cap, c.counts
		FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS r(ts, id, sc, name, i)
		LEFT JOIN {schema}.meter_events m ON m.event_ts = r.ts AND m.identifier = r.id AND m.event_ts = ANY($1)
		LEFT JOIN {schema}.meter_inflight s ON s.stripe_customer_id = r.sc AND s.event_name = r.name
		LEFT JOIN LATERAL (SELECT * `+applicableSQL("caps", "r.name", "r.sc", monthSQL("r.ts"))+`) c ON true
		LEFT JOIN {schema}.meter_usage u ON c.cap IS NOT NULL AND u.event_name = r.name AND u.stripe_customer_id = r.sc
			AND u.month = `+monthSQL("r.ts"),
		ts, ids, scs, names)
	if err != nil {
		return nil, fmt.Errorf("reading %d meter events: %w", n, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s slot
		var exp *time.Time
		var i int
		var units, events int64
		var capCus, capMonth, capCounts *string
		var capUnits *int64
		rec, found, err := scanRecord(rows, &s.Identifier, &s.Owner, &exp, &s.Token, &i,
			&units, &events, &capCus, &capMonth, &capUnits, &capCounts)
		if err != nil {
			return nil, fmt.Errorf("scanning meter event: %w", err)
		}
		s.ExpiresAt = utc(exp)
		it := items[i-1]
		it.slot = s
		it.use = CapState{Units: units, Events: events, Month: MonthOf(it.key.EventTS)}
		if capUnits != nil {
			it.capped = true
			it.use.Cap = Cap{EventName: it.req.Event.EventName, StripeCustomerID: *capCus, Month: *capMonth,
				Cap: *capUnits, Counts: Counts(*capCounts)}
		}
		if found {
			it.row = &rec
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading %d meter events: %w", n, err)
	}
	return items, nil
}

// write makes every planned write in one statement. Slots are locked in
// (customer, meter) order before rows, as Finish does, and each write
// checks the state it was decided from: the slot's grant (cas), the row's
// epoch and dead lease.
func (l *Ledger) write(ctx context.Context, items []*item, now time.Time) error {
	var idx, ops []int32
	var ts, exp []time.Time
	var ids, names, scs, custs, owners, msgs, reasons []string
	var vals, epochs, cas, toks []int64
	var cnts []bool
	for _, it := range items {
		if it.op == opNone {
			continue
		}
		ev := it.req.Event
		c := it.freeTok // park, free: the stale grant to delete
		if it.op == opInsert || it.op == opTakeOver || it.op == opReopen || it.op == opDequeue {
			c = it.slot.Token // the grant to replace; 0: none seen, insert one
		}
		idx, ops = append(idx, int32(it.i)), append(ops, int32(it.op))
		ts, exp = append(ts, it.key.EventTS), append(exp, now.Add(it.req.Lease))
		ids, names, scs, custs = append(ids, it.key.Identifier), append(names, ev.EventName), append(scs, ev.StripeCustomerID), append(custs, ev.CustomerID)
		reason := it.claim.Reason
		if it.op == opReopen {
			reason = it.req.Override // the reopen's $15: the operator's override, if any
		}
		owners, msgs, reasons = append(owners, it.req.Owner), append(msgs, it.req.MessageID), append(reasons, reason)
		vals, epochs, cas, toks = append(vals, ev.Value), append(epochs, it.claim.Record.Epoch), append(cas, c), append(toks, it.newTok)
		cnts = append(cnts, (it.op == opInsert || it.op == opReopen) && it.counts())
	}
	rows, err := l.pool.Query(ctx, reserveSQL, idx, ops, ts, ids, names, scs, custs, vals, owners, exp, msgs,
		epochs, cas, toks, reasons, now, l.writer(), cnts)
	if err != nil {
		return fmt.Errorf("recording %d meter event decisions: %w", len(idx), err)
	}
	defer rows.Close()
	var seq *int64
	var leaked, overCap []*item
	for rows.Next() {
		var i int
		var got, cnt, counted bool
		rec, found, err := scanRecord(rows, &i, &got, &seq, &cnt, &counted)
		if err != nil {
			return fmt.Errorf("scanning meter event decision: %w", err)
		}
		it := items[i]
		it.counted = counted
		switch {
		case found && (it.op == opInsert || it.op == opDequeue):
			it.claim = Claim{Decision: Acquired, Record: rec, slotToken: it.newTok}
		case found && it.op == opTakeOver:
			it.claim = Claim{Decision: TakenOver, Record: rec, slotToken: it.newTok}
		case found && it.op == opReopen:
			it.claim = Claim{Decision: Reopened, Record: rec, slotToken: it.newTok}
		case found && it.op == opPark:
			it.claim = Claim{Decision: Parked, Record: rec, Reason: it.claim.Reason}
		case got && cnt && !counted:
			// The cap refused it on the latest count (someone else's
			// event of the month counted in between, or the cap changed):
			// give the grant back; the reason is read again below.
			leaked = append(leaked, it)
			overCap = append(overCap, it)
		case it.op == opInsert || it.op == opTakeOver || it.op == opReopen || it.op == opDequeue:
			if got { // the row moved on after the read: give the grant (and the units) back
				leaked = append(leaked, it)
				it.claim = Claim{Decision: Busy, Record: it.claim.Record, Reason: "the event's row changed while this batch was decided"}
			} else {
				it.claim = Claim{Decision: SlotBusy, Record: it.claim.Record, Reason: "the customer's meter slot was taken while this batch was decided"}
			}
		case it.op == opPark:
			it.claim = Claim{Decision: Busy, Record: it.claim.Record, Reason: "the event's row changed while this batch was decided"}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("recording %d meter event decisions: %w", len(idx), err)
	}
	if seq != nil && *seq > 0 {
		l.witness.Committed(*seq)
	}
	// The decisions are committed and stand; a grant not given back expires
	// with the lease it was made for, so a failure here only delays the
	// customer's meter (and units not given back make the count high by
	// them, never low: a cap is reached early, never passed).
	_ = l.giveBack(ctx, leaked)
	for _, it := range overCap {
		l.refuseOverCap(ctx, it)
	}
	return nil
}

// refuseOverCap answers OverCap for an event the write statement's cap
// check refused, with the cap and count as they stand now.
func (l *Ledger) refuseOverCap(ctx context.Context, it *item) {
	ev := it.req.Event
	st := CapState{Units: it.use.Units, Events: it.use.Events, Month: MonthOf(it.key.EventTS), Cap: it.use.Cap}
	if c, found, err := l.CapFor(ctx, ev.EventName, ev.StripeCustomerID, st.Month); err == nil && found {
		st.Cap = c
	}
	if us, err := l.Usage(ctx, ev.EventName, ev.StripeCustomerID, st.Month); err == nil && len(us) == 1 {
		st.Units, st.Events = us[0].Units, us[0].Events
	}
	it.claim = Claim{Decision: OverCap, Record: it.claim.Record, Cap: st, Reason: capReason(st, ev.StripeCustomerID, ev.Value)}
}

// giveBack frees grants made for sends whose row write did not happen (a
// rare race with another reservation of the same event, or the cap), so the
// customer's meter is not blocked until the grant expires, and takes back
// the units counted for them, in one statement.
func (l *Ledger) giveBack(ctx context.Context, leaked []*item) error {
	if len(leaked) == 0 {
		return nil
	}
	n := len(leaked)
	scs, names, toks := make([]string, n), make([]string, n), make([]int64, n)
	ts, vals, cnts := make([]time.Time, n), make([]int64, n), make([]bool, n)
	for i, it := range leaked {
		scs[i], names[i], toks[i] = it.req.Event.StripeCustomerID, it.req.Event.EventName, it.newTok
		ts[i], vals[i], cnts[i] = it.key.EventTS, it.req.Event.Value, it.counted
	}
	if _, err := l.pool.Exec(ctx, `WITH u AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::bigint[], $6::bool[])
				AS u(stripe_customer_id, event_name, tok, event_ts, value, cnt)
		), freed AS (
			DELETE FROM {schema}.meter_inflight s USING u
			WHERE s.stripe_customer_id = u.stripe_customer_id AND s.event_name = u.event_name AND s.token = u.tok
		)
		`+uncountSQL("u WHERE cnt", "now()"),
		scs, names, toks, ts, vals, cnts); err != nil {
		return fmt.Errorf("giving back %d unused meter slots: %w", n, err)
	}
	return nil
}

// reserveSQL: $1 request index, $2 op, $3… the event; $12 the epoch read,
// $13 the slot grant read (0: none seen), $14 the new grant, $15 the
// park's reason, $16 now, $17 the witness' writer (empty: none), $18
// whether the send adds the event to its customer's use of the meter.
//
// The use is counted (counted) after the slot is taken and before the row
// is written, in one upsert of meter_usage whose condition is the cap's:
// the check and the addition are made on the latest committed count, under
// the row's lock, so the fleet's sends never pass a cap together. A row is
// written only if its use was counted.
var reserveSQL = `
WITH a AS (
	SELECT *, ` + monthSQL("a.ts") + ` AS month
	FROM unnest($1::int[], $2::int[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], $7::text[],
		$8::bigint[], $9::text[], $10::timestamptz[], $11::text[], $12::bigint[], $13::bigint[], $14::bigint[], $15::text[],
		$18::bool[])
		AS a(i, op, ts, id, name, sc, cust, val, owner, exp, msg, seen_epoch, cas, tok, reason, cnt)
), caps AS MATERIALIZED (
	SELECT * FROM {schema}.meter_caps WHERE event_name = ANY($5)
), locked AS (
	SELECT s.stripe_customer_id AS sc, s.event_name AS name FROM {schema}.meter_inflight s
	JOIN a ON s.stripe_customer_id = a.sc AND s.event_name = a.name AND s.token = a.cas
	WHERE a.cas <> 0 ORDER BY 1, 2 FOR UPDATE OF s
), slot_ins AS (
	INSERT INTO {schema}.meter_inflight (stripe_customer_id, event_name, identifier, event_ts, owner, expires_at, token)
	SELECT a.sc, a.name, a.id, a.ts, a.owner, a.exp, a.tok FROM a WHERE a.op IN (1, 2, 5, 6) AND a.cas = 0 ORDER BY a.sc, a.name
	ON CONFLICT DO NOTHING RETURNING token
), slot_cas AS (
	UPDATE {schema}.meter_inflight s SET identifier = a.id, event_ts = a.ts, owner = a.owner, expires_at = a.exp, token = a.tok
	FROM a JOIN locked ON locked.sc = a.sc AND locked.name = a.name
	WHERE a.op IN (1, 2, 5, 6) AND s.stripe_customer_id = a.sc AND s.event_name = a.name AND s.token = a.cas
	RETURNING s.token
), slot_free AS (
	DELETE FROM {schema}.meter_inflight s USING a JOIN locked ON locked.sc = a.sc AND locked.name = a.name
	WHERE a.op IN (3, 4) AND s.stripe_customer_id = a.sc AND s.event_name = a.name AND s.token = a.cas
), got AS (
	SELECT token FROM slot_ins UNION ALL SELECT token FROM slot_cas
), counted AS (
	-- One send per customer and meter per batch: no usage row twice.
	INSERT INTO {schema}.meter_usage AS u (event_name, stripe_customer_id, month, units, events, updated_at)
	SELECT a.name, a.sc, a.month, a.val, 1, $16 FROM a JOIN got ON got.token = a.tok
	WHERE a.cnt AND ` + capAllowsSQL("a.name", "a.sc", "a.month", "0", "0", "a.val") + `
	ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE
		SET units = u.units + EXCLUDED.units, events = u.events + 1, updated_at = EXCLUDED.updated_at
		WHERE ` + capAllowsSQL("EXCLUDED.event_name", "EXCLUDED.stripe_customer_id", "EXCLUDED.month", "u.units", "u.events", "EXCLUDED.units") + `
	RETURNING u.event_name, u.stripe_customer_id, u.month
), ins AS (
	INSERT INTO {schema}.meter_events (event_ts, identifier, event_name, stripe_customer_id, customer_id, value, status,
		first_sent_at, attempts, epoch, lease_owner, lease_expires_at, stream_message_id, entry_second, created_at)
	SELECT a.ts, a.id, a.name, a.sc, nullif(a.cust, ''), a.val, 'sending', $16, 1, ` + firstEpoch + `, a.owner, a.exp,
		` + entryValuesSQL("nullif(a.msg, '')") + `, $16
	FROM a JOIN got ON got.token = a.tok
	JOIN counted k ON k.event_name = a.name AND k.stripe_customer_id = a.sc AND k.month = a.month
	WHERE a.op = 1 ORDER BY a.ts, a.id
	ON CONFLICT DO NOTHING RETURNING *
), take AS (
	-- A row never sent (0 attempts: given back unsent) starts its safe
	-- window now; any other is an attempt of unknown outcome.
	UPDATE {schema}.meter_events m SET epoch = ` + nextEpoch + `, attempts = m.attempts + 1, outcome_unknown = m.attempts > 0 OR m.outcome_unknown,
		first_sent_at = CASE WHEN m.attempts = 0 THEN $16 ELSE m.first_sent_at END, lease_owner = a.owner,
		lease_expires_at = a.exp, ` + entrySetSQL("coalesce(nullif(a.msg, ''), m.stream_message_id)") + `
	FROM a JOIN got ON got.token = a.tok
	WHERE a.op = 2 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($3) AND m.epoch = a.seen_epoch
		AND m.status = 'sending' AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= $16)
	RETURNING m.*
), reopen AS (
	UPDATE {schema}.meter_events m SET status = 'sending', event_name = a.name, stripe_customer_id = a.sc,
		customer_id = coalesce(nullif(a.cust, ''), m.customer_id), value = a.val,
		-- An event Stripe may have (parked, or failed after an attempt of
		-- unknown outcome) keeps its first attempt: its identifier is
		-- guarded only that long. An override (the reason) is the
		-- operator's word that Stripe does not have it.
		first_sent_at = CASE WHEN a.reason = '' AND m.settled_at IS NULL AND (m.status = 'parked' OR m.outcome_unknown)
			THEN m.first_sent_at ELSE $16 END,
		outcome_unknown = a.reason = '' AND m.settled_at IS NULL AND (m.status = 'parked' OR m.outcome_unknown),
		replay_override = coalesce(nullif(a.reason, ''), m.replay_override), settled_at = NULL, settled_by = NULL, settle_reason = NULL,
		attempts = m.attempts + 1, epoch = ` + nextEpoch + `, lease_owner = a.owner, lease_expires_at = a.exp,
		delivered_at = NULL, last_error = NULL,
		` + entrySetSQL("coalesce(nullif(a.msg, ''), m.stream_message_id)") + `
	FROM a JOIN got ON got.token = a.tok
	WHERE a.op = 5 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($3) AND m.epoch = a.seen_epoch
		AND m.status IN ('failed', 'parked')
		AND (NOT a.cnt OR EXISTS (SELECT 1 FROM counted k WHERE k.event_name = a.name AND k.stripe_customer_id = a.sc AND k.month = a.month))
	RETURNING m.*
), deq AS (
	-- A queued row (Ingest counted its use) sending: its first attempt
	-- starts now, unless an earlier one's outcome is unknown.
	UPDATE {schema}.meter_events m SET status = 'sending', epoch = ` + nextEpoch + `,
		attempts = CASE WHEN m.outcome_unknown THEN m.attempts + 1 ELSE 1 END,
		first_sent_at = CASE WHEN m.outcome_unknown THEN m.first_sent_at ELSE $16 END,
		lease_owner = a.owner, lease_expires_at = a.exp
	FROM a JOIN got ON got.token = a.tok
	WHERE a.op = 6 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($3) AND m.epoch = a.seen_epoch
		AND m.status = 'queued'
	RETURNING m.*
), park AS (
	UPDATE {schema}.meter_events m SET status = 'parked', lease_owner = NULL, lease_expires_at = NULL, last_error = a.reason
	FROM a
	WHERE a.op = 3 AND m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($3) AND m.epoch = a.seen_epoch
		AND m.status IN ('sending', 'queued') AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= $16)
	RETURNING m.*
), bump AS (
	-- ledger.BumpWitness's statement: a park is acked, so it is witnessed.
	INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at)
	SELECT $17, 1, $16 WHERE $17 <> '' AND EXISTS (SELECT 1 FROM park)
	ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $16
	RETURNING seq
)
SELECT ` + cols("w") + `, a.i, got.token IS NOT NULL, (SELECT seq FROM bump), a.cnt,
	a.cnt AND got.token IS NOT NULL AND EXISTS (SELECT 1 FROM counted k
		WHERE k.event_name = a.name AND k.stripe_customer_id = a.sc AND k.month = a.month)
FROM a
LEFT JOIN got ON got.token = a.tok
LEFT JOIN (SELECT * FROM ins UNION ALL SELECT * FROM take UNION ALL SELECT * FROM reopen UNION ALL SELECT * FROM deq
	UNION ALL SELECT * FROM park) w
	ON w.event_ts = a.ts AND w.identifier = a.id`
