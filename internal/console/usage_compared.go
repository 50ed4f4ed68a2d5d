package console

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
)

// What the Usage page claims is limited to what was compared: the last
// usage runs (usage_runs) and, per meter of a customer, the last run that
// compared it and what it has not compared yet (usage_compared, migration
// 00030, beside the meter ledger's events).

// usageRun is one of the last usage reconciliation runs.
type usageRun struct {
	ID         int64
	Started    time.Time
	Finished   *time.Time
	DailyFrom  time.Time
	ComparedTo time.Time
	Windows    int64
	Error      string
}

const qUsageRuns = `SELECT id, started_at, finished_at, daily_from, compared_to, windows_compared, coalesce(error, '')
	FROM {schema}.usage_runs ORDER BY id DESC LIMIT $1`

func usageRuns(ctx context.Context, db pg.DB, n int) ([]usageRun, error) {
	rows, err := db.Query(ctx, qUsageRuns, n)
	if err != nil {
		return nil, fmt.Errorf("reading the last usage runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[usageRun])
	for i := range out {
		out[i].Error = redact.String(truncate(out[i].Error, 300))
	}
	return out, err
}

// comparedRow is one meter of a customer: the last comparison of it, and
// the ledger's events of it that comparison did not cover.
type comparedRow struct {
	EventName string
	// Run is the last run that compared it; nil: never compared.
	Run         *int64
	At          *time.Time
	From, To    *time.Time
	Windows     int64
	HeldWindows int64
	HeldFrom    *time.Time
	Events      int64 // the ledger's events of it (the last 36 days)
	NotCompared int64 // delivered, and not in the last comparison
	NotUnits    int64
	// Queued: recorded, not sent yet (Stripe does not have them: never a
	// difference), QueuedOldest when the oldest was recorded; Sending: in
	// flight or of unknown outcome (compared as an interval); Stopped:
	// parked or failed (a person's, or a replay's).
	Queued       int64
	QueuedOldest *time.Time
	Sending      int64
	Stopped      int64
	LatestEvent  time.Time
	NeverCompare bool
}

// QueuedAge is how long the oldest queued event has waited, at now.
func (c comparedRow) QueuedAge(now time.Time) time.Duration {
	return meterBacklog{Oldest: c.QueuedOldest}.Age(now)
}

// qCompared is, per meter of a customer, its last comparison and the
// delivered events it did not cover: timestamped outside its span or from
// the first window it held back, or delivered after it looked (at most:
// a window after the first held one may have been compared).
const qCompared = `SELECT e.event_name, c.run_id, c.compared_at, c.compared_from, c.compared_to, coalesce(c.windows, 0),
	coalesce(c.held_windows, 0)::bigint, c.held_from,
	count(*),
	count(*) FILTER (WHERE e.status = 'delivered' AND (c.run_id IS NULL OR e.event_ts < c.compared_from
		OR e.event_ts >= coalesce(c.held_from, c.compared_to) OR e.delivered_at >= c.compared_at)),
	coalesce(sum(e.value) FILTER (WHERE e.status = 'delivered' AND (c.run_id IS NULL OR e.event_ts < c.compared_from
		OR e.event_ts >= coalesce(c.held_from, c.compared_to) OR e.delivered_at >= c.compared_at)), 0),
	count(*) FILTER (WHERE e.status = 'queued'), min(e.created_at) FILTER (WHERE e.status = 'queued'),
	count(*) FILTER (WHERE e.status = 'sending'), count(*) FILTER (WHERE e.status IN ('parked', 'failed')),
	max(e.event_ts)
FROM {schema}.meter_events e
LEFT JOIN {schema}.usage_compared c ON c.event_name = e.event_name AND c.stripe_customer_id = e.stripe_customer_id
WHERE e.stripe_customer_id = $1 AND ($2 = '' OR e.event_name = $2)
GROUP BY e.event_name, c.run_id, c.compared_at, c.compared_from, c.compared_to, c.windows, c.held_windows, c.held_from
ORDER BY e.event_name`

func comparedOf(ctx context.Context, db pg.DB, customer, meter string) ([]comparedRow, error) {
	rows, err := db.Query(ctx, qCompared, customer, meter)
	if err != nil {
		return nil, fmt.Errorf("reading what usage runs compared for %s: %w", customer, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (comparedRow, error) {
		var c comparedRow
		err := r.Scan(&c.EventName, &c.Run, &c.At, &c.From, &c.To, &c.Windows, &c.HeldWindows, &c.HeldFrom,
			&c.Events, &c.NotCompared, &c.NotUnits, &c.Queued, &c.QueuedOldest, &c.Sending, &c.Stopped, &c.LatestEvent)
		c.NeverCompare = c.Run == nil
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading what usage runs compared for %s: %w", customer, err)
	}
	return out, nil
}

// comparedCounts is how many customer-meters the last finished run
// compared and how many it held back windows of.
type comparedCounts struct {
	LastRun  int64
	Compared int64
	Held     int64
}

func comparedTotals(ctx context.Context, db pg.DB, run int64) (comparedCounts, error) {
	c := comparedCounts{LastRun: run}
	err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE held_windows > 0) FROM {schema}.usage_compared WHERE run_id = $1`, run).
		Scan(&c.Compared, &c.Held)
	if err != nil {
		return c, fmt.Errorf("counting what usage run %d compared: %w", run, err)
	}
	return c, nil
}

// staleRow is a customer-meter with usage this month and its last
// comparison, if any.
type staleRow struct {
	EventName, Customer string
	Events              int64
	Run                 *int64
	At, To              *time.Time
	HeldWindows         int64
}

// qStale lists this month's customer-meters (meter_usage: one row per
// meter, customer and month) never compared first, then the least
// recently compared; and counts those never compared.
const qStale = `SELECT u.event_name, u.stripe_customer_id, u.events, c.run_id, c.compared_at, c.compared_to, coalesce(c.held_windows, 0)::bigint
FROM {schema}.meter_usage u LEFT JOIN {schema}.usage_compared c
	ON c.event_name = u.event_name AND c.stripe_customer_id = u.stripe_customer_id
WHERE u.month = $1 AND ($2 = '' OR u.event_name = $2)
ORDER BY c.compared_at NULLS FIRST, u.stripe_customer_id, u.event_name LIMIT $3`

const qNeverCompared = `SELECT count(*) FILTER (WHERE c.run_id IS NULL), count(*)
FROM {schema}.meter_usage u LEFT JOIN {schema}.usage_compared c
	ON c.event_name = u.event_name AND c.stripe_customer_id = u.stripe_customer_id
WHERE u.month = $1 AND ($2 = '' OR u.event_name = $2)`

// staleOf is the page's "least recently compared" list and how many of
// this month's customer-meters no run has compared.
func staleOf(ctx context.Context, db pg.DB, month time.Time, meter string, n int) ([]staleRow, int64, int64, error) {
	rows, err := db.Query(ctx, qStale, month, meter, n)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("listing the least recently compared customer-meters: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[staleRow])
	if err != nil {
		return nil, 0, 0, fmt.Errorf("listing the least recently compared customer-meters: %w", err)
	}
	var never, all int64
	if err := db.QueryRow(ctx, qNeverCompared, month, meter).Scan(&never, &all); err != nil {
		return nil, 0, 0, fmt.Errorf("counting customer-meters never compared: %w", err)
	}
	return out, never, all, nil
}
