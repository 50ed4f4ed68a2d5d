package ledger

import (
	"context"
	"fmt"
	"time"
)

// ByIdempotencyKeys reads the rows named by Stripe charges' metadata (the
// auditor's join), keyed by idempotency key.
func (l *Ledger) ByIdempotencyKeys(ctx context.Context, keys []string) (map[string]Record, error) {
	out := make(map[string]Record, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE idempotency_key = ANY($1::text[])`, keys)
	if err != nil {
		return nil, fmt.Errorf("reading %d billing records by key: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning billing record: %w", err)
		}
		out[r.IdempotencyKey] = r
	}
	return out, rows.Err()
}

// ScanCharged streams charged rows whose charge was recorded in [from, to),
// oldest first, without holding them all in memory.
func (l *Ledger) ScanCharged(ctx context.Context, from, to time.Time, fn func(Record) error) error {
	return l.scan(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE status = 'charged' AND charged_at >= $1 AND charged_at < $2 ORDER BY charged_at`, fn, from, to)
}

// ScanStuckPending streams pending rows nobody is working on: no lease, or a
// lease that expired, and untouched since before olderThan; and, whatever
// their age, the rows the ledger parked (its own retries gave up: a
// person must look).
func (l *Ledger) ScanStuckPending(ctx context.Context, olderThan time.Time, fn func(Record) error) error {
	return l.scan(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE status = 'pending' AND (parked_at IS NOT NULL
			OR ((lease_expires_at IS NULL OR lease_expires_at < $1) AND updated_at < $1))
		ORDER BY updated_at`, fn, olderThan)
}

// ScanStuckProcessing streams processing rows (a bank debit in motion)
// untouched since before olderThan: no settlement (poll or webhook) moved
// them, and polls do not touch updated_at, so it is the time the row
// became processing.
func (l *Ledger) ScanStuckProcessing(ctx context.Context, olderThan time.Time, fn func(Record) error) error {
	return l.scan(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE status = 'processing' AND updated_at < $1
		ORDER BY updated_at`, fn, olderThan)
}

func (l *Ledger) scan(ctx context.Context, sql string, fn func(Record) error, args ...any) error {
	rows, err := l.pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("scanning billing records: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return fmt.Errorf("scanning billing record: %w", err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Counts returns the number of rows per status.
func (l *Ledger) Counts(ctx context.Context) (map[Status]int, error) {
	rows, err := l.pool.Query(ctx, `SELECT status, count(*) FROM {schema}.billing_records GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("counting billing records: %w", err)
	}
	defer rows.Close()
	out := map[Status]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[Status(s)] = n
	}
	return out, rows.Err()
}
