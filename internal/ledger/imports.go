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

// HasImportedHistory reports whether `consumer import` has brought history
// into period: pelguard cannot then prove from its own ledger that a key of
// that period was never charged, and asks Stripe before charging
// (invariant 9).
func (l *Ledger) HasImportedHistory(ctx context.Context, period string) (bool, error) {
	c := &l.imported
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.periods == nil || time.Since(c.read) > importedCacheTTL {
		rows, err := l.pool.Query(ctx, `SELECT billing_period FROM {schema}.imported_periods`)
		if err != nil {
			return false, fmt.Errorf("reading imported periods: %w", err)
		}
		defer rows.Close()
		m := map[string]bool{}
		for rows.Next() {
			var p string
			if err := rows.Scan(&p); err != nil {
				return false, err
			}
			m[p] = true
		}
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("reading imported periods: %w", err)
		}
		c.periods, c.read = m, time.Now()
	}
	return c.periods[period], nil
}
