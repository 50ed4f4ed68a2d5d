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
