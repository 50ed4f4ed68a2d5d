package meterledger

import (
	"context"
	"fmt"
	"time"
)

// Result is how a send ended, as Finish records it.
type Result int

const (
	// Delivered: Stripe accepted the event, or refused its identifier as a
	// duplicate (stripeapi.ErrDuplicateIdentifier: an earlier attempt got
	// through, and Stripe counts it). Ack.
	Delivered Result = iota + 1
	// Failed: Stripe refused the event for good (stripeapi.ErrInvalidRequest:
	// unknown meter, bad value, timestamp out of range). Dead-letter, ack.
	// An event an earlier attempt of which ended with an unknown outcome
	// is never recorded failed: Stripe may count that attempt. Finish
	// parks it instead (FinishResults says so), its units still counted.
	Failed
	// Park: the holder stops re-sending the event itself (an outcome it
	// cannot resolve, such as stripeapi.ErrIdempotencyMismatch): a person
	// looks. Alert, ack.
	Park
	// Release: a transient or unknown outcome (timeout, 5xx, 429, a
	// cancelled call): lease and slot are freed and the row stays sending,
	// to be re-sent under the same identifier by the next delivery while
	// the safe window lasts. Do not ack.
	Release
	// Unsent: the call was never made (billing from the stream was paused
	// after the reservation): lease and slot are freed and the row stays
	// sending like Release, but no attempt of unknown outcome is recorded
	// and the reservation's attempt is taken back; a row never sent (0
	// attempts) has its safe window start at its next attempt. Do not ack.
	Unsent
)

var resultStatus = map[Result]string{Delivered: "delivered", Failed: "failed", Park: "parked", Release: "sending", Unsent: "unsent"}

func (r Result) String() string {
	if r == Release {
		return "release"
	}
	if s, ok := resultStatus[r]; ok {
		return s
	}
	return fmt.Sprintf("result(%d)", int(r))
}

// Outcome is one holder's result for Finish.
type Outcome struct {
	Hold   Hold
	Result Result
	// Reason: required for Failed and Park (recorded in last_error, shown
	// to operators); optional for Release.
	Reason string
}

// ParkedAfterUnknown begins the reason of an event Finish parked instead of
// failing it.
const ParkedAfterUnknown = "an earlier attempt's outcome is unknown, so Stripe may count the event; a later attempt was refused"

// Finish records a batch of outcomes in one statement (one transaction),
// each fenced by its holder's epoch and the row still sending, frees their
// slots (by grant, so a holder whose slot expired and was taken frees
// nothing), and bumps the witness when a terminal outcome was recorded.
// recorded[i] reports whether outs[i] was written: only then may its
// stream entry be acked (invariant 3); one not recorded lost its lease
// (someone took the event over, or it was parked): leave it.
func (l *Ledger) Finish(ctx context.Context, outs []Outcome) (recorded []bool, err error) {
	res, err := l.FinishResults(ctx, outs)
	if err != nil {
		return nil, err
	}
	recorded = make([]bool, len(outs))
	for i, r := range res {
		recorded[i] = r != 0
	}
	return recorded, nil
}

// FinishResults is Finish returning what was recorded for each outcome: 0
// where nothing was (the lease was lost), else the result as recorded,
// which is Park where a Failed outcome met an event whose earlier attempt's
// outcome is unknown (its reason then begins with ParkedAfterUnknown).
func (l *Ledger) FinishResults(ctx context.Context, outs []Outcome) (results []Result, err error) {
	results = make([]Result, len(outs))
	if len(outs) == 0 {
		return results, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	n := len(outs)
	ts := make([]time.Time, n)
	ids, statuses, reasons, scs, names := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	epochs, toks := make([]int64, n), make([]int64, n)
	for i, o := range outs {
		st, ok := resultStatus[o.Result]
		switch {
		case !ok:
			return nil, fmt.Errorf("meter ledger: outcome %d of %s is not a result", o.Result, o.Hold.Key)
		case (o.Result == Failed || o.Result == Park) && o.Reason == "":
			return nil, fmt.Errorf("meter ledger: a %s outcome for %s needs a reason", o.Result, o.Hold.Key)
		}
		h := o.Hold
		ts[i], ids[i], statuses[i], reasons[i], scs[i], names[i] = h.EventTS, h.Identifier, st, o.Reason, h.StripeCustomerID, h.EventName
		epochs[i], toks[i] = h.Epoch, h.SlotToken
	}
	rows, err := l.pool.Query(ctx, finishSQL, ts, ids, epochs, statuses, reasons, scs, names, toks, now, l.writer(), ParkedAfterUnknown)
	if err != nil {
		return nil, fmt.Errorf("recording %d meter event outcomes: %w", n, err)
	}
	defer rows.Close()
	var seq *int64
	for rows.Next() {
		var i int
		var st string
		if err := rows.Scan(&i, &seq, &st); err != nil {
			return nil, fmt.Errorf("recording meter event outcomes: %w", err)
		}
		results[i-1] = outs[i-1].Result
		if st == string(StatusParked) && outs[i-1].Result == Failed {
			results[i-1] = Park
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recording %d meter event outcomes: %w", n, err)
	}
	if seq != nil && *seq > 0 {
		l.witness.Committed(*seq)
	}
	return results, nil
}

// finishSQL frees the slots first (the order Reserve locks in: slots, then
// rows), then writes the rows, takes a failed event's value back from its
// customer's use of the meter, then the witness.
var finishSQL = `
WITH u AS (
	SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[])
		WITH ORDINALITY AS u(ts, id, e, st, reason, sc, name, tok, i)
), freed AS (
	DELETE FROM {schema}.meter_inflight s USING u
	WHERE s.stripe_customer_id = u.sc AND s.event_name = u.name AND s.token = u.tok
	RETURNING 1
), done AS (
	-- A refusal after an attempt of unknown outcome parks (Stripe may
	-- count that attempt); a release records that an attempt's outcome is
	-- unknown, an unsent event (no call made) does not, and gives its
	-- attempt back.
	UPDATE {schema}.meter_events m SET
		status = CASE WHEN u.st = 'failed' AND m.outcome_unknown THEN 'parked' WHEN u.st = 'unsent' THEN 'sending' ELSE u.st END,
		lease_owner = NULL, lease_expires_at = NULL,
		delivered_at = CASE WHEN u.st = 'delivered' THEN $9::timestamptz END,
		last_error = CASE WHEN u.st = 'delivered' THEN NULL WHEN u.st = 'failed' AND m.outcome_unknown THEN $11 || ': ' || u.reason
			ELSE coalesce(nullif(u.reason, ''), m.last_error) END,
		outcome_unknown = m.outcome_unknown OR u.st = 'sending',
		attempts = CASE WHEN u.st = 'unsent' THEN m.attempts - 1 ELSE m.attempts END
	FROM u
	WHERE m.event_ts = u.ts AND m.identifier = u.id AND m.event_ts = ANY($1) AND m.epoch = u.e AND m.status = 'sending'
		AND (SELECT count(*) FROM freed) >= 0
	RETURNING u.i, m.status AS st, m.event_name, m.stripe_customer_id, m.event_ts, m.value
), uncounted AS (
	-- Stripe refused these: they count nothing against the customer's use.
	` + uncountSQL("done WHERE st = 'failed'", "$9") + `
), bump AS (
	-- ledger.BumpWitness's statement: an ack follows a terminal outcome.
	INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at)
	SELECT $10, 1, $9 WHERE $10 <> '' AND EXISTS (SELECT 1 FROM done WHERE st <> 'sending')
	ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $9
	RETURNING seq
)
SELECT done.i, (SELECT seq FROM bump), done.st FROM done`

// ExtendMany renews the leases and slots of many holds in one statement
// (the heartbeat). lost[i] reports that holds[i] no longer holds its event:
// the row is sending under another epoch or owner, or the slot grant is
// gone while the row is still the caller's (the slot expired and another
// event of the customer's meter took it). A row that is no longer sending
// (finished) is not lost: there is nothing left to cancel. A lease whose
// slot is gone is not renewed: the holder must stop, and Release. Rows and
// slots someone has locked right now are skipped, not waited for, and
// renewed at the next beat.
func (l *Ledger) ExtendMany(ctx context.Context, holds []Hold, lease time.Duration) (lost []bool, err error) {
	lost = make([]bool, len(holds))
	if len(holds) == 0 {
		return lost, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	n := len(holds)
	ts := make([]time.Time, n)
	ids, owners, scs, names := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	epochs, toks := make([]int64, n), make([]int64, n)
	for i, h := range holds {
		ts[i], ids[i], owners[i], scs[i], names[i], epochs[i], toks[i] = h.EventTS, h.Identifier, h.Owner, h.StripeCustomerID, h.EventName, h.Epoch, h.SlotToken
	}
	rows, err := l.pool.Query(ctx, `
		WITH u AS (
			SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[])
				WITH ORDINALITY AS u(ts, id, e, o, sc, name, tok, i)
		), slots AS (
			SELECT s.stripe_customer_id AS sc, s.event_name AS name FROM {schema}.meter_inflight s
			JOIN u ON s.stripe_customer_id = u.sc AND s.event_name = u.name AND s.token = u.tok
			ORDER BY 1, 2 FOR UPDATE OF s SKIP LOCKED
		), slots_upd AS (
			UPDATE {schema}.meter_inflight s SET expires_at = $8 FROM slots
			WHERE s.stripe_customer_id = slots.sc AND s.event_name = slots.name
		), mine AS (
			SELECT m.event_ts, m.identifier FROM {schema}.meter_events m
			JOIN u ON m.event_ts = u.ts AND m.identifier = u.id
			JOIN {schema}.meter_inflight s ON s.stripe_customer_id = u.sc AND s.event_name = u.name AND s.token = u.tok
			WHERE m.event_ts = ANY($1) AND m.epoch = u.e AND m.lease_owner = u.o AND m.status = 'sending'
			ORDER BY 1, 2 FOR UPDATE OF m SKIP LOCKED
		), rows_upd AS (
			UPDATE {schema}.meter_events m SET lease_expires_at = $8 FROM mine
			WHERE m.event_ts = mine.event_ts AND m.identifier = mine.identifier
		)
		SELECT u.i FROM u
		JOIN {schema}.meter_events m ON m.event_ts = u.ts AND m.identifier = u.id AND m.event_ts = ANY($1)
		LEFT JOIN {schema}.meter_inflight s ON s.stripe_customer_id = u.sc AND s.event_name = u.name AND s.token = u.tok
		WHERE m.status = 'sending' AND (m.epoch <> u.e OR m.lease_owner IS DISTINCT FROM u.o OR s.token IS NULL)`,
		ts, ids, epochs, owners, scs, names, toks, now.Add(lease))
	if err != nil {
		return nil, fmt.Errorf("extending %d meter event leases: %w", n, err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, fmt.Errorf("extending meter event leases: %w", err)
		}
		lost[i-1] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("extending %d meter event leases: %w", n, err)
	}
	return lost, nil
}
