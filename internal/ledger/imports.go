package ledger

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// importedCacheTTL bounds how long a consumer may miss a period that
// `consumer import` has just recorded. The runbook imports before pelguard
// starts billing, so the cache only saves a query per charge.
const importedCacheTTL = 30 * time.Second

type importedCache struct {
	mu      sync.Mutex
	read    time.Time
	periods map[string]bool
}

// ImportedPeriods is every period with imported history (read fresh).
func (l *Ledger) ImportedPeriods(ctx context.Context) (map[string]bool, error) {
	rows, err := l.pool.Query(ctx, `SELECT billing_period FROM {schema}.imported_periods`)
	if err != nil {
		return nil, fmt.Errorf("reading imported periods: %w", err)
	}
	defer rows.Close()
	m := map[string]bool{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		m[p] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading imported periods: %w", err)
	}
	return m, nil
}

// HasImportedHistory reports whether `consumer import` has brought history
// into period: pelguard cannot then prove from its own ledger that a key of
// that period was never charged, and asks Stripe before charging
// (invariant 9).
func (l *Ledger) HasImportedHistory(ctx context.Context, period string) (bool, error) {
	c := &l.imported
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.periods == nil || time.Since(c.read) > importedCacheTTL {
		m, err := l.ImportedPeriods(ctx)
		if err != nil {
			return false, err
		}
		c.periods, c.read = m, time.Now()
	}
	return c.periods[period], nil
}

// ImportResult is what Import did with one record.
type ImportResult struct {
	Key Key
	// Inserted: the row is new. Otherwise Existing is the row the ledger
	// already had, which Import never changes.
	Inserted bool
	Existing Record
}

// Import records what a team billed before pelguard: terminal rows
// (charged with the real charge id, or declined), no lease, epoch 1,
// attempts 0 (pelguard made no attempt). A key the ledger already has is
// left as it is and returned as Existing, so a rerun changes nothing. Each
// key's shared lock is held to the commit, so an import cannot record a
// charge for a key while a refund of that key is deciding, and a charge
// pelguard refunded as a duplicate is refused (ErrChargeRefunded, nothing
// imported).
func (l *Ledger) Import(ctx context.Context, recs []Record) ([]ImportResult, error) {
	out := make([]ImportResult, 0, len(recs))
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	now := l.clock.Now()
	for _, r := range recs {
		if r.Status != StatusCharged && r.Status != StatusDeclined {
			return nil, fmt.Errorf("importing %s: status %q (want charged or declined)", r.Key, r.Status)
		}
		var chargeID *string
		var chargedAt *time.Time
		if err := l.lockKeysShared(ctx, tx, r.Key, StripeLockKey(r.StripeCustomerID, r.BillingPeriod)); err != nil {
			return nil, err
		}
		if r.Status == StatusCharged {
			chargeID, chargedAt = &r.ChargeID, &r.ChargedAt
			var refunded bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.refund_ledger WHERE charge_id = $1)`,
				r.ChargeID).Scan(&refunded); err != nil {
				return nil, fmt.Errorf("importing %s: %w", r.Key, err)
			}
			if refunded {
				// Its canonical charge is another one: importing this would
				// make a refunded charge the key's charge.
				return nil, fmt.Errorf("importing %s: charge %s: %w", r.Key, r.ChargeID, ErrChargeRefunded)
			}
		}
		tag, err := tx.Exec(ctx, `
			INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents,
				currency, idempotency_key, status, charge_id, charged_at, epoch, attempts, first_attempt_at,
				last_error, created_at, updated_at, attempt_epoch)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, `+firstEpoch+`, 0, $10, nullif($11, ''), $12, $12, `+firstEpoch+`)
			ON CONFLICT DO NOTHING`,
			r.CustomerID, r.BillingPeriod, r.StripeCustomerID, r.AmountCents, r.Currency, r.IdempotencyKey,
			string(r.Status), chargeID, chargedAt, r.FirstAttemptAt, r.LastError, now)
		if err != nil {
			return nil, fmt.Errorf("importing %s: %w", r.Key, err)
		}
		res := ImportResult{Key: r.Key, Inserted: tag.RowsAffected() == 1}
		if !res.Inserted {
			// The key, its idempotency key or its charge id is taken.
			existing, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
				WHERE (customer_id = $1 AND billing_period = $2) OR idempotency_key = $3 OR charge_id = $4
				ORDER BY (customer_id = $1 AND billing_period = $2) DESC LIMIT 1`,
				r.CustomerID, r.BillingPeriod, r.IdempotencyKey, chargeID))
			if err != nil {
				return nil, fmt.Errorf("reading the ledger row that blocks importing %s: %w", r.Key, err)
			}
			res.Existing = existing
		}
		out = append(out, res)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}
