package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// What else a ledger that lost commits has lost, and the repair rebuilds:
// refund_ledger (the rolling refund cap), spend-cap reservations, and the
// keys it cannot decide by itself (a finding).

// RefundSourceRebuilt is refund_ledger.source of a refund rebuilt from
// Stripe's refunds.
const RefundSourceRebuilt = "rebuilt"

// RebuiltRefund is one of pelguard's refunds as Stripe has it.
type RebuiltRefund struct {
	RefundID    string
	ChargeID    string
	AmountCents int64
	Currency    string
	Created     time.Time
	// CustomerID and BillingPeriod, when the refund's metadata names them.
	CustomerID    string
	BillingPeriod string
}

// lockRefundLedger is the refunders' lock (audit's lockRefundLedger, the
// same key): every refunder sums the rolling cap and records its refund
// under it, so a refund rebuilt meanwhile is either counted by its sum or
// waits for its record.
const lockRefundLedger = `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/refund_ledger', 0))`

// RebuildRefunds inserts the refunds refund_ledger lacks (source
// RefundSourceRebuilt, refunded_at the refund's creation), so the rolling
// refund cap counts every refund pelguard made, and a ledger write refuses
// their charges (ErrChargeRefunded). A refund or charge already there is
// left as it is. It returns how many rows it inserted.
func (l *Ledger) RebuildRefunds(ctx context.Context, refunds []RebuiltRefund) (int, error) {
	if len(refunds) == 0 {
		return 0, nil
	}
	n := len(refunds)
	ids, charges, cur, cust, per := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, at := make([]int64, n), make([]time.Time, n)
	for i, r := range refunds {
		if r.RefundID == "" || r.ChargeID == "" || r.AmountCents < 0 || r.Created.IsZero() {
			return 0, fmt.Errorf("ledger: rebuilding refund %q of charge %q: a refund id, a charge id, its time and a non-negative amount are required",
				r.RefundID, r.ChargeID)
		}
		ids[i], charges[i], cur[i], cust[i], per[i] = r.RefundID, r.ChargeID, r.Currency, r.CustomerID, r.BillingPeriod
		amounts[i], at[i] = r.AmountCents, r.Created
	}
	var inserted int64
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockRefundLedger, l.Schema()); err != nil {
			return fmt.Errorf("taking the refund ledger lock: %w", err)
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents, currency,
				customer_id, billing_period, source)
			SELECT u.at, u.ch, u.id, u.amt, u.cur, nullif(u.c, ''), nullif(u.p, ''), $8
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[], $6::text[], $7::text[])
				AS u(id, ch, amt, cur, at, c, p)
			ON CONFLICT DO NOTHING`, ids, charges, amounts, cur, at, cust, per, RefundSourceRebuilt)
		inserted = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("rebuilding %d refunds in refund_ledger: %w", n, err)
	}
	return int(inserted), nil
}

// CapRecount is what RecountCaps did to one period's cap.
type CapRecount struct {
	Cap
	// Before is reserved_cents before the recount; RowsCents what the
	// period's rows (and the reaper's external leases) reserve. RowsCents
	// above CapCents: the period's charges exceed its cap (the cap holds
	// CapCents).
	Before    int64
	RowsCents int64
}

// Over reports whether the period's rows reserve more than its cap.
func (c CapRecount) Over() bool { return c.RowsCents > c.CapCents }

// RecountCaps sets each period's reservation to what its rows reserve
// (billing_records.cap_reserved_cents and the reaper's external leases),
// clipped to the cap: a failover may have lost reservations with the rows
// that held them, and the rows rebuilt reserve again. Periods without a cap
// are skipped. The cap row is locked before its rows are summed, so a
// reservation or release in flight is counted exactly once.
func (l *Ledger) RecountCaps(ctx context.Context, periods []string) ([]CapRecount, error) {
	var out []CapRecount
	for _, p := range periods {
		var rc CapRecount
		found := true
		err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			err := tx.QueryRow(ctx, `SELECT cap_cents, reserved_cents FROM {schema}.spend_caps WHERE billing_period = $1 FOR UPDATE`,
				p).Scan(&rc.CapCents, &rc.Before)
			if errors.Is(err, pgx.ErrNoRows) {
				found = false
				return nil
			}
			if err != nil {
				return err
			}
			// A statement of its own: under READ COMMITTED it sees every
			// reservation committed before the cap's lock was granted.
			if err := tx.QueryRow(ctx, `SELECT
					coalesce((SELECT sum(cap_reserved_cents) FROM {schema}.billing_records WHERE billing_period = $1), 0) +
					coalesce((SELECT sum(cap_reserved_cents) FROM {schema}.external_leases WHERE billing_period = $1), 0)`,
				p).Scan(&rc.RowsCents); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = least(cap_cents, $2),
					updated_at = CASE WHEN reserved_cents = least(cap_cents, $2) THEN updated_at ELSE $3 END
				WHERE billing_period = $1
				RETURNING billing_period, cap_cents, reserved_cents, updated_at`, p, rc.RowsCents, l.clock.Now()).
				Scan(&rc.BillingPeriod, &rc.CapCents, &rc.ReservedCents, &rc.UpdatedAt)
		})
		if err != nil {
			return out, fmt.Errorf("recounting the spend cap of %s: %w", p, err)
		}
		if found {
			out = append(out, rc)
		}
	}
	return out, nil
}

// FindingRefundedOnly is the audit_findings kind of a key whose only
// charges at Stripe are fully refunded, found by the ledger's repair.
const FindingRefundedOnly = "refunded_only"

// RefundedOnly is a key the repair does not record as charged: Stripe has
// charges of it, all fully refunded (by pelguard or by hand).
type RefundedOnly struct {
	Key
	StripeCustomerID string
	IdempotencyKey   string
	// ChargeID is the key's earliest such charge; AmountCents its amount.
	ChargeID    string
	AmountCents int64
	Currency    string
	Detail      string
}

// RecordRefundedOnly stores f as an open refunded_only finding (subject:
// the key's idempotency key), under the key's shared locks, unless the
// key's row is charged by now (nothing is then undecided). recorded says
// whether the finding exists now; isNew whether this call added it (a
// rerun adds nothing).
func (l *Ledger) RecordRefundedOnly(ctx context.Context, f RefundedOnly) (recorded, isNew bool, err error) {
	if f.CustomerID == "" || f.BillingPeriod == "" || f.IdempotencyKey == "" {
		return false, false, fmt.Errorf("ledger: a refunded_only finding of %s needs its key and idempotency key", f.Key)
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		recorded, isNew = false, false
		if err := l.lockKeysShared(ctx, tx, f.Key, StripeLockKey(f.StripeCustomerID, f.BillingPeriod)); err != nil {
			return err
		}
		var charged bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.billing_records
			WHERE customer_id = $1 AND billing_period = $2 AND status = 'charged')`, f.CustomerID, f.BillingPeriod).Scan(&charged); err != nil {
			return err
		}
		if charged {
			return nil
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO {schema}.audit_findings (kind, subject, customer_id, billing_period, stripe_customer_id,
				charge_id, idempotency_key, amount_cents, currency, detail)
			VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), $2, $7, nullif($8, ''), $9)
			ON CONFLICT (kind, subject) DO NOTHING`,
			FindingRefundedOnly, f.IdempotencyKey, f.CustomerID, f.BillingPeriod, f.StripeCustomerID, f.ChargeID,
			f.AmountCents, f.Currency, f.Detail)
		recorded, isNew = true, tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, false, fmt.Errorf("recording the refunded_only finding of %s: %w", f.Key, err)
	}
	return recorded, isNew, nil
}
