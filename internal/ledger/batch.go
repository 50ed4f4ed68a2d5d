package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReserveNew is Reserve's fast path for a batch of first deliveries: one
// INSERT … SELECT FROM unnest … ON CONFLICT DO NOTHING, committed on its own
// (one round trip, one WAL flush for the whole batch). It inserts only rows
// whose period has no spend cap row, and returns the rows it inserted, all
// with the caller's lease at epoch 1 (the same state Reserve's Acquired
// gives). Every request it did not insert (a row already exists, or the
// period has a cap) must go through Reserve, which decides as usual.
// Duplicate keys within reqs: only the first is considered.
//
// Periods without a cap row are not reserved against any cap, exactly as in
// Reserve; a cap created while this statement runs applies to later events.
func (l *Ledger) ReserveNew(ctx context.Context, reqs []ReserveRequest) (map[Key]Record, error) {
	out := make(map[Key]Record, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	now := l.clock.Now()
	n := len(reqs)
	cust, per, scust, cur, key, owner, msg := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n),
		make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	amt := make([]int64, 0, n)
	exp := make([]time.Time, 0, n)
	seen := make(map[Key]bool, n)
	for _, r := range reqs {
		if r.Owner == "" || r.Lease <= 0 || r.IdempotencyKey == "" || r.RequireCap {
			continue // Reserve reports what is wrong, or enforces the cap rule
		}
		k := EventKey(r.Event)
		if seen[k] {
			continue
		}
		seen[k] = true
		e := r.Event
		cust, per, scust, cur = append(cust, e.CustomerID), append(per, e.BillingPeriod), append(scust, e.StripeCustomerID), append(cur, e.Currency)
		key, owner, msg = append(key, r.IdempotencyKey), append(owner, r.Owner), append(msg, r.MessageID)
		amt, exp = append(amt, e.AmountCents), append(exp, now.Add(r.Lease))
	}
	if len(cust) == 0 {
		return out, nil
	}
	rows, err := l.pool.Query(ctx, `
		INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents,
			currency, idempotency_key, status, lease_owner, lease_expires_at, epoch, attempts,
			first_attempt_at, stream_message_id, created_at, updated_at, attempt_epoch)
		SELECT u.c, u.p, u.sc, u.a, u.cur, u.k, 'pending', u.o, u.exp, `+firstEpoch+`, 1, $10, u.m, $10, $10, `+firstEpoch+`
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
			$7::text[], $8::timestamptz[], $9::text[]) AS u(c, p, sc, a, cur, k, o, exp, m)
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.spend_caps s WHERE s.billing_period = u.p)
		ON CONFLICT DO NOTHING
		RETURNING `+recordCols,
		cust, per, scust, amt, cur, key, owner, exp, msg, now)
	if err != nil {
		return nil, fmt.Errorf("reserving %d new billing records: %w", len(cust), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning reserved record: %w", err)
		}
		out[r.Key] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reserving %d new billing records: %w", len(cust), err)
	}
	return out, nil
}

// Charged is one charged outcome for FinishCharged.
type Charged struct {
	Record   Record // as the caller holds it (its epoch fences the write)
	ChargeID string
}

// FinishCharged records many charged outcomes in one fenced statement (group
// commit: one round trip and one WAL flush for every charge finished while
// the previous batch was being written). It returns the keys it recorded;
// a key missing from the result lost its lease, or names a charge pelguard
// refunded (ErrLeaseLost or ErrChargeRefunded semantics: do not ack it).
// The statement holds every key's shared lock (keylock.go).
func (l *Ledger) FinishCharged(ctx context.Context, cs []Charged) (map[Key]bool, error) {
	done := make(map[Key]bool, len(cs))
	if len(cs) == 0 {
		return done, nil
	}
	now := l.clock.Now()
	// One lock order for every multi-row write, so two of them never deadlock.
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b Charged) int {
		return cmp.Or(cmp.Compare(a.Record.CustomerID, b.Record.CustomerID), cmp.Compare(a.Record.BillingPeriod, b.Record.BillingPeriod))
	})
	cust, per, ch := make([]string, len(cs)), make([]string, len(cs)), make([]string, len(cs))
	ep := make([]int64, len(cs))
	for i, c := range cs {
		if c.ChargeID == "" {
			return nil, fmt.Errorf("ledger: a charged outcome for %s needs a charge id", c.Record.Key)
		}
		cust[i], per[i], ch[i], ep[i] = c.Record.CustomerID, c.Record.BillingPeriod, c.ChargeID, c.Record.Epoch
	}
	err := l.witnessTx(ctx, func(tx pgx.Tx) error {
		// Every key's lock before any Stripe customer's, the order a refund
		// takes them in, so the two never wait on each other in a circle.
		keys := make([]Key, 0, 2*len(cs))
		for _, c := range cs {
			keys = append(keys, c.Record.Key)
		}
		for _, c := range cs {
			keys = append(keys, StripeLockKey(c.Record.StripeCustomerID, c.Record.BillingPeriod))
		}
		if err := l.lockKeysShared(ctx, tx, keys...); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			UPDATE {schema}.billing_records b SET status = 'charged', charge_id = u.ch, charged_at = $5,
				lease_owner = NULL, lease_expires_at = NULL, last_error = NULL, updated_at = $5
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(c, p, e, ch)
			WHERE b.customer_id = u.c AND b.billing_period = u.p AND b.epoch = u.e AND b.status = 'pending'
				AND NOT EXISTS (SELECT 1 FROM {schema}.refund_ledger f WHERE f.charge_id = u.ch)
			RETURNING b.customer_id, b.billing_period`, cust, per, ep, ch, now)
		if err != nil {
			return fmt.Errorf("recording %d charges: %w", len(cs), err)
		}
		defer rows.Close()
		for rows.Next() {
			var k Key
			if err := rows.Scan(&k.CustomerID, &k.BillingPeriod); err != nil {
				return fmt.Errorf("recording charges: %w", err)
			}
			done[k] = true
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("recording %d charges: %w", len(cs), err)
		}
		return nil
	})
	if err != nil {
		clear(done)
		return nil, err
	}
	return done, nil
}
