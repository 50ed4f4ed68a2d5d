package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// BatchClaim is ReserveBatch's answer to one request.
type BatchClaim struct {
	// Decided: the batch decided the request, as Reserve would have. When
	// false the caller reserves it with Reserve: a replay of a reopenable
	// row, a key a second time in the batch, a request Reserve refuses, or
	// a row that changed under the batch.
	Decided bool
	Claim   Claim
	// Err is the spend cap's refusal, as Reserve returns it (*CapError, or
	// ErrNoCap under RequireCap): nothing was written for the request.
	Err error
}

// ReserveBatch is Reserve for a consumer's read batch: the same decision
// for every request (Acquired with the spend cap reserved, TakenOver past
// an expired or released lease, AlreadyTerminal, Busy, Conflict, a cap
// refusal), with the same epochs above the epoch floor, in at most two
// commits for the whole batch instead of one transaction per event:
//
//  1. first deliveries of periods without a cap: one INSERT … SELECT FROM
//     unnest (ReserveNew), committed on its own: the only statement of a
//     batch of new events;
//  2. everything else, in one transaction: the existing rows and the
//     periods' caps locked in one round trip, decided in Go
//     (decideExisting, and the caps in request order, as Reserve would
//     one after the other), then every takeover, capped insert and cap
//     reservation written in one statement.
//
// claims[i] answers reqs[i]. If step 2 fails, err says why and claims still
// hold what step 1 reserved (those leases are the caller's); the rest are
// left undecided for Reserve.
func (l *Ledger) ReserveBatch(ctx context.Context, reqs []ReserveRequest) ([]BatchClaim, error) {
	claims := make([]BatchClaim, len(reqs))
	if len(reqs) == 0 {
		return claims, nil
	}
	// The first request of each valid key; later ones go to Reserve (which
	// finds the row this batch reserved: Busy).
	first := make(map[Key]int, len(reqs))
	for i, r := range reqs {
		if r.Owner == "" || r.Lease <= 0 || r.IdempotencyKey == "" {
			continue
		}
		if _, dup := first[EventKey(r.Event)]; !dup {
			first[EventKey(r.Event)] = i
		}
	}
	newReqs := make([]ReserveRequest, 0, len(first))
	for i, r := range reqs {
		if j, ok := first[EventKey(r.Event)]; ok && j == i {
			newReqs = append(newReqs, r)
		}
	}
	inserted, err := l.ReserveNew(ctx, newReqs)
	if err != nil {
		return claims, err
	}
	var rest []int
	for i, r := range reqs {
		k := EventKey(r.Event)
		if j, ok := first[k]; !ok || j != i {
			continue
		}
		if rec, ok := inserted[k]; ok {
			claims[i] = BatchClaim{Decided: true, Claim: Claim{Decision: Acquired, Record: rec}}
			continue
		}
		rest = append(rest, i)
	}
	if len(rest) == 0 {
		return claims, nil
	}
	if err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		return l.reserveRestTx(ctx, tx, reqs, rest, claims)
	}); err != nil {
		for _, i := range rest {
			claims[i] = BatchClaim{}
		}
		return claims, fmt.Errorf("reserving %d redelivered or capped events: %w", len(rest), err)
	}
	return claims, nil
}

// reserveRestTx decides reqs[rest] (none of them inserted by ReserveNew)
// in tx, filling claims.
func (l *Ledger) reserveRestTx(ctx context.Context, tx pgx.Tx, reqs []ReserveRequest, rest []int, claims []BatchClaim) error {
	now := l.clock.Now()
	rows, caps, err := l.lockForBatch(ctx, tx, reqs, rest)
	if err != nil {
		return err
	}
	var takes, inserts []int
	for _, i := range rest { // request order: the caps are spent as Reserve would spend them
		r := reqs[i]
		k := EventKey(r.Event)
		if rec, ok := rows[k]; ok {
			switch d := decideExisting(rec, r, now); d {
			case Reopened:
				// A replayed dead letter of a failed row: Reserve reopens
				// it (cancelling the last intent comes first), one by one.
			case TakenOver:
				takes = append(takes, i)
			default:
				claims[i] = BatchClaim{Decided: true, Claim: Claim{Decision: d, Record: rec}}
			}
			continue
		}
		c, capped := caps[k.BillingPeriod]
		switch {
		case capped && c.ReservedCents+r.Event.AmountCents <= c.CapCents:
			c.ReservedCents += r.Event.AmountCents
			caps[k.BillingPeriod] = c
			inserts = append(inserts, i)
		case capped:
			claims[i] = BatchClaim{Decided: true, Err: &CapError{Period: k.BillingPeriod, CapCents: c.CapCents,
				ReservedCents: c.ReservedCents, RequestedCents: r.Event.AmountCents}}
		case r.RequireCap:
			claims[i] = BatchClaim{Decided: true, Err: fmt.Errorf("%s: %w", k.BillingPeriod, ErrNoCap)}
		}
		// No row and no cap: ReserveNew's insert met a row that is gone
		// now (its insert rolled back). Reserve decides it afresh.
	}
	if len(takes)+len(inserts) == 0 {
		return nil
	}
	got, err := l.writeBatch(ctx, tx, reqs, takes, inserts, now)
	if err != nil {
		return err
	}
	for _, i := range takes {
		if rec, ok := got[EventKey(reqs[i].Event)]; ok {
			claims[i] = BatchClaim{Decided: true, Claim: Claim{Decision: TakenOver, Record: rec}}
		}
	}
	for _, i := range inserts {
		if rec, ok := got[EventKey(reqs[i].Event)]; ok {
			claims[i] = BatchClaim{Decided: true, Claim: Claim{Decision: Acquired, Record: rec}}
		}
		// Not inserted: another consumer's insert won the key after the
		// lock above; its cents were not reserved. Reserve decides it.
	}
	return nil
}

// lockForBatch reads, in one round trip, the rows of reqs[idx] that exist
// and the caps of their periods, each locked (FOR UPDATE) to the end of tx,
// rows before caps and each in key order: the order Reserve and
// finishUncharged take them in.
func (l *Ledger) lockForBatch(ctx context.Context, tx pgx.Tx, reqs []ReserveRequest, idx []int) (map[Key]Record, map[string]Cap, error) {
	cust, per := make([]string, len(idx)), make([]string, len(idx))
	for j, i := range idx {
		cust[j], per[j] = reqs[i].Event.CustomerID, reqs[i].Event.BillingPeriod
	}
	// A batch bypasses the schema-qualifying Tx: name the schema here.
	b := &pgx.Batch{}
	b.Queue(l.pool.SQL(`SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE (customer_id, billing_period) IN (SELECT * FROM unnest($1::text[], $2::text[]))
		ORDER BY customer_id, billing_period FOR UPDATE`), cust, per)
	b.Queue(l.pool.SQL(`SELECT billing_period, cap_cents, reserved_cents, updated_at FROM {schema}.spend_caps
		WHERE billing_period = ANY($1::text[]) ORDER BY billing_period FOR UPDATE`), per)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	recs, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("locking %d billing records: %w", len(idx), err)
	}
	rows := make(map[Key]Record, len(idx))
	for recs.Next() {
		r, err := scanRecord(recs)
		if err != nil {
			recs.Close()
			return nil, nil, fmt.Errorf("scanning billing record: %w", err)
		}
		rows[r.Key] = r
	}
	if err := recs.Err(); err != nil {
		return nil, nil, fmt.Errorf("locking %d billing records: %w", len(idx), err)
	}
	cr, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("locking spend caps: %w", err)
	}
	caps := map[string]Cap{}
	for cr.Next() {
		var c Cap
		if err := cr.Scan(&c.BillingPeriod, &c.CapCents, &c.ReservedCents, &c.UpdatedAt); err != nil {
			cr.Close()
			return nil, nil, fmt.Errorf("scanning spend cap: %w", err)
		}
		caps[c.BillingPeriod] = c
	}
	if err := cr.Err(); err != nil {
		return nil, nil, fmt.Errorf("locking spend caps: %w", err)
	}
	return rows, caps, br.Close()
}

// writeBatch takes over reqs[takes]'s rows and inserts reqs[inserts]'s with
// their cap reservations, in one statement, and returns the rows written.
func (l *Ledger) writeBatch(ctx context.Context, tx pgx.Tx, reqs []ReserveRequest, takes, inserts []int, now time.Time) (map[Key]Record, error) {
	// One key order for every multi-row write, so two of them never deadlock.
	byKey := func(a, b int) int {
		ka, kb := EventKey(reqs[a].Event), EventKey(reqs[b].Event)
		return cmp.Or(cmp.Compare(ka.CustomerID, kb.CustomerID), cmp.Compare(ka.BillingPeriod, kb.BillingPeriod))
	}
	takes, inserts = slices.Clone(takes), slices.Clone(inserts)
	slices.SortFunc(takes, byKey)
	slices.SortFunc(inserts, byKey)
	var tc, tp, to, tm []string
	var texp []time.Time
	for _, i := range takes {
		r := reqs[i]
		tc, tp, to, tm = append(tc, r.Event.CustomerID), append(tp, r.Event.BillingPeriod), append(to, r.Owner), append(tm, r.MessageID)
		texp = append(texp, now.Add(r.Lease))
	}
	var ic, ip, isc, icur, ikey, io, im []string
	var iamt []int64
	var iexp []time.Time
	for _, i := range inserts {
		r, e := reqs[i], reqs[i].Event
		ic, ip, isc, icur = append(ic, e.CustomerID), append(ip, e.BillingPeriod), append(isc, e.StripeCustomerID), append(icur, e.Currency)
		ikey, io, im = append(ikey, r.IdempotencyKey), append(io, r.Owner), append(im, r.MessageID)
		iamt, iexp = append(iamt, e.AmountCents), append(iexp, now.Add(r.Lease))
	}
	rows, err := tx.Query(ctx, `
		WITH tk AS (
			UPDATE {schema}.billing_records b SET epoch = `+nextEpoch+`, attempts = attempts + 1, lease_owner = t.o,
				lease_expires_at = t.exp, stream_message_id = t.m, updated_at = $15
			FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[]) AS t(c, p, o, exp, m)
			WHERE customer_id = t.c AND billing_period = t.p
			RETURNING b.*
		), ins AS (
			INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents,
				currency, idempotency_key, status, lease_owner, lease_expires_at, epoch, attempts,
				first_attempt_at, attempt_started_at, stream_message_id, created_at, updated_at, attempt_epoch,
				cap_reserved_cents)
			SELECT u.c, u.p, u.sc, u.a, u.cur, u.k, 'pending', u.o, u.exp, `+firstEpoch+`, 1, $15, $15, u.m, $15, $15,
				`+firstEpoch+`, u.a
			FROM unnest($6::text[], $7::text[], $8::text[], $9::bigint[], $10::text[], $11::text[],
				$12::text[], $13::timestamptz[], $14::text[]) AS u(c, p, sc, a, cur, k, o, exp, m)
			ON CONFLICT DO NOTHING
			RETURNING *
		), reserved AS (
			UPDATE {schema}.spend_caps s SET reserved_cents = s.reserved_cents + x.cents, updated_at = $15
			FROM (SELECT billing_period, sum(cap_reserved_cents) AS cents FROM ins GROUP BY billing_period) x
			WHERE s.billing_period = x.billing_period
		)
		SELECT `+recordCols+` FROM tk
		UNION ALL
		SELECT `+recordCols+` FROM ins`,
		tc, tp, to, texp, tm, ic, ip, isc, iamt, icur, ikey, io, iexp, im, now)
	if err != nil {
		return nil, fmt.Errorf("writing %d takeovers and %d capped reservations: %w", len(takes), len(inserts), err)
	}
	defer rows.Close()
	got := make(map[Key]Record, len(takes)+len(inserts))
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning reserved record: %w", err)
		}
		got[r.Key] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("writing %d takeovers and %d capped reservations: %w", len(takes), len(inserts), err)
	}
	return got, nil
}
