package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SeedForTest bulk-loads records with COPY, bypassing Reserve and Finish.
// It exists for the auditor's tests and benchmarks, which need 100,000 rows
// in seconds; production code must never call it, because it skips the
// lease, the fencing epoch and the spend cap. Zero times default to now,
// an empty status to charged, an empty currency to usd and a zero epoch
// and attempts to 1.
func (l *Ledger) SeedForTest(ctx context.Context, recs []Record) (int64, error) {
	now := l.clock.Now()
	rows := make([][]any, len(recs))
	for i, r := range recs {
		status := r.Status
		if status == "" {
			status = StatusCharged
		}
		currency := r.Currency
		if currency == "" {
			currency = "usd"
		}
		first := r.FirstAttemptAt
		if first.IsZero() {
			first = now
		}
		var chargeID, owner *string
		var chargedAt, leaseExp *time.Time
		if r.ChargeID != "" {
			chargeID = &r.ChargeID
		}
		if status == StatusCharged {
			t := r.ChargedAt
			if t.IsZero() {
				t = now
			}
			chargedAt = &t
		}
		if r.LeaseOwner != "" {
			owner = &r.LeaseOwner
			t := r.LeaseExpiresAt
			leaseExp = &t
		}
		created, updated := r.CreatedAt, r.UpdatedAt
		if created.IsZero() {
			created = first
		}
		if updated.IsZero() {
			updated = created
		}
		rows[i] = []any{r.CustomerID, r.BillingPeriod, r.StripeCustomerID, r.AmountCents, currency,
			r.IdempotencyKey, string(status), chargeID, owner, leaseExp, max(r.Epoch, 1),
			max(r.Attempts, 1), first, chargedAt, created, updated}
	}
	n, err := l.pool.CopyFrom(ctx, pgx.Identifier{"billing_records"}, []string{
		"customer_id", "billing_period", "stripe_customer_id", "amount_cents", "currency",
		"idempotency_key", "status", "charge_id", "lease_owner", "lease_expires_at", "epoch",
		"attempts", "first_attempt_at", "charged_at", "created_at", "updated_at",
	}, pgx.CopyFromRows(rows))
	if err != nil {
		return n, fmt.Errorf("seeding %d billing records: %w", len(recs), err)
	}
	return n, nil
}

// ByChargeIDs reads the rows that record the given Stripe charge ids, keyed
// by charge id: the auditor keeps only charge ids while it lists Stripe and
// reads the few rows it reports as missing_charge afterwards.
func (l *Ledger) ByChargeIDs(ctx context.Context, ids []string) (map[string]Record, error) {
	out := make(map[string]Record, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records WHERE charge_id = ANY($1::text[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading %d billing records by charge id: %w", len(ids), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning billing record: %w", err)
		}
		out[r.ChargeID] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading %d billing records by charge id: %w", len(ids), err)
	}
	return out, nil
}

// StripeKey is a Stripe customer and a billing period: all a charge that
// pelguard did not make (an old consumer's) says about what it billed.
type StripeKey struct{ StripeCustomerID, BillingPeriod string }

// ByStripeKeys reads the rows billed to the given Stripe customers for the
// given periods, grouped by key: the auditor's --legacy comparison. One
// Stripe customer may stand for several ledger customers, so a key may have
// several rows. No index serves this read (it scans billing_records once per
// call); only the auditor's --legacy runs make it, a batch of keys at a time.
func (l *Ledger) ByStripeKeys(ctx context.Context, keys []StripeKey) (map[StripeKey][]Record, error) {
	out := make(map[StripeKey][]Record, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cust := make([]string, len(keys))
	per := make([]string, len(keys))
	for i, k := range keys {
		cust[i], per[i] = k.StripeCustomerID, k.BillingPeriod
	}
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE (stripe_customer_id, billing_period) IN (SELECT * FROM unnest($1::text[], $2::text[]))
		ORDER BY customer_id`, cust, per)
	if err != nil {
		return nil, fmt.Errorf("reading billing records of %d Stripe customers: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning billing record: %w", err)
		}
		k := StripeKey{r.StripeCustomerID, r.BillingPeriod}
		out[k] = append(out[k], r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading billing records of %d Stripe customers: %w", len(keys), err)
	}
	return out, nil
}
