package meterledger

import (
	"context"
	"fmt"
	"time"
)

// Planner statistics of the busy partitions.
//
// A day's partition is created empty and filled at the pace of ingest.
// Until it is analyzed the planner takes it for nearly empty and, with
// every index looking alike, walks the smallest one: reading a
// customer-meter's oldest queued event then filters every queued row of
// the day (measured: a listing of candidates took 5 s instead of 12 ms
// with 100,000 rows queued). Autovacuum analyzes a table only after a
// share of its rows changed and at most once a minute (its nap), too late
// for a partition filling at thousands of rows a second. So the sender
// analyzes the partitions it reads itself, once enough of their rows
// changed (FreshenStats).
const (
	// statsMinChanges and statsChangeShare: a partition is analyzed once
	// its rows changed since its last analyze by at least the larger of
	// statsMinChanges and statsChangeShare of its rows.
	statsMinChanges  = 1000
	statsChangeShare = 0.5
	// statsMinInterval: a partition analyzed (by anyone, autovacuum too)
	// within it is left alone.
	statsMinInterval = 30 * time.Second
)

// FreshenStats analyzes meter_events' partitions from from's day on whose
// planner statistics are stale (see above) and returns their names. An
// analyze holds no lock that blocks writes, samples a bounded number of
// rows whatever the partition's size, and skips a partition another
// session is analyzing. A role that does not own the tables gets
// Postgres's warning and no analyze: autovacuum's, later, is then the only
// one.
func (l *Ledger) FreshenStats(ctx context.Context, from time.Time) ([]string, error) {
	// The statistics functions are read for meter_events' partitions
	// only: the pg_stat_user_tables view reads every table's, which took
	// 0.6 s a call on a loaded server.
	names, err := l.partitionNames(ctx, "reading meter_events' partition statistics", `c.relname >= $2
		AND pg_stat_get_mod_since_analyze(c.oid) >= greatest($3::float8, $4::float8 * greatest(c.reltuples, 0))
		AND coalesce(greatest(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)), '-infinity')
			< now() - make_interval(secs => $5)`,
		partitionOf(day(from)).Name, float64(statsMinChanges), statsChangeShare, statsMinInterval.Seconds())
	if err != nil {
		return nil, err
	}
	var done []string
	for _, name := range names {
		if err := l.analyze(ctx, name); err != nil {
			return done, fmt.Errorf("analyzing %s: %w", name, err)
		}
		done = append(done, name)
	}
	return done, nil
}

// statsTarget is the statistics target of the sender's analyze: a sample
// of 300 times it rows. The plans it guards against come from a partition
// taken for empty; the share of queued rows and the busy customers are
// plain in 6,000 rows. At the default (30,000 rows) an analyze of a
// filling partition took 1.1 s of a loaded server's CPU, beside the busy
// customer's sends; on an idle one, 110,000 rows took 200 ms at the
// default and 40 ms at 20.
const statsTarget = 20

// analyze analyzes partition name at statsTarget, skipped when another
// session is analyzing it.
func (l *Ledger) analyze(ctx context.Context, name string) error {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL default_statistics_target = %d`, statsTarget)); err != nil {
		return err
	}
	// DDL-like: no parameters; the name is ours (partitionNames matched it) and quoted.
	if _, err := tx.Exec(ctx, `ANALYZE (SKIP_LOCKED) `+l.qualified(name)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
