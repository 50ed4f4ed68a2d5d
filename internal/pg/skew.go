package pg

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClockSkew is how far hostNow is ahead of Postgres' clock (negative:
// behind), counting only what the round trip cannot explain: Postgres'
// reading is compared with the host's before and after the query, so
// network latency never shows as skew.
func ClockSkew(ctx context.Context, pool *pgxpool.Pool, hostNow func() time.Time) (time.Duration, error) {
	before := hostNow()
	var db time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
		return 0, fmt.Errorf("reading Postgres' clock: %w", err)
	}
	after := hostNow()
	switch {
	case db.Before(before):
		return before.Sub(db), nil
	case db.After(after):
		return -db.Sub(after), nil
	}
	return 0, nil
}
