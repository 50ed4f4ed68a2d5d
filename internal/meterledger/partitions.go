package meterledger

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pelguard/pelguard/event"
)

// meter_events is partitioned by the day (UTC) of the event's timestamp.
const (
	// Retention is how long a day's partition is kept after it ends:
	// Stripe's 35 days, and a day of margin for clocks. Every event Stripe
	// still takes has its partition, and so its delivered row.
	Retention = event.MeterEventMaxAge + 24*time.Hour
	// Ahead is how far into the future partitions are made: Stripe takes
	// events 5 minutes ahead; two days leave a day's runs of
	// EnsurePartitions to fail without a row going unplaced.
	Ahead = 48 * time.Hour
	// partitionLockTimeout bounds the wait for the parent's lock (creating
	// or dropping a partition takes an exclusive lock on meter_events):
	// better to fail and retry later than to queue the fleet's writes
	// behind a long reader.
	partitionLockTimeout = "5s"
)

const partitionPrefix = "meter_events_p"

var partitionName = regexp.MustCompile(`^meter_events_p(\d{8})$`)

// Partition is one day of meter_events.
type Partition struct {
	Name     string
	From, To time.Time // [From, To): one UTC day
}

func day(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

func partitionOf(d time.Time) Partition {
	return Partition{Name: partitionPrefix + d.Format("20060102"), From: d, To: d.AddDate(0, 0, 1)}
}

// Partitions lists meter_events' daily partitions in the schema, oldest
// first. Tables attached under other names are not pelguard's and are
// neither listed nor dropped.
func (l *Ledger) Partitions(ctx context.Context) ([]Partition, error) {
	names, err := l.partitionNames(ctx, "listing meter_events' partitions", "true")
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, n := range names {
		m := partitionName.FindStringSubmatch(n)
		d, err := time.Parse("20060102", m[1])
		if err != nil {
			continue
		}
		out = append(out, partitionOf(d))
	}
	slices.SortFunc(out, func(a, b Partition) int { return a.From.Compare(b.From) })
	return out, nil
}

// partitionNames lists the names of meter_events' daily partitions in the
// schema (tables attached under other names left out) for which cond, SQL
// on pg_class c with its parameters from $2 (args), holds, in name order.
// doing names the work in an error.
func (l *Ledger) partitionNames(ctx context.Context, doing, cond string, args ...any) ([]string, error) {
	rows, err := l.pool.Query(ctx, `SELECT c.relname::text FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = '{schema}.meter_events'::regclass AND n.nspname = $1 AND (`+cond+`)
		ORDER BY c.relname`, append([]any{l.pool.Schema()}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	return slices.DeleteFunc(names, func(n string) bool { return !partitionName.MatchString(n) }), nil
}

// EnsurePartitions makes the daily partitions of [now - Retention,
// now + Ahead] that are missing and returns their names. Idempotent, and
// safe to run from every process at once: a transaction-scoped advisory
// lock serialises pelguard's runs, and a partition made meanwhile by
// anyone else (a duplicate-table error) is taken as made. Run it at start
// and daily; Reserve runs it too when a batch needs a day it has not seen.
func (l *Ledger) EnsurePartitions(ctx context.Context, now time.Time) ([]string, error) {
	from, to := day(now.Add(-Retention)), day(now.Add(Ahead))
	var created []string
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		created, err = l.ensure(ctx, from, to)
		if !duplicate(err) && !lockTimeout(err) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.ensuredFrom, l.ensuredTo = from, to.AddDate(0, 0, 1)
	l.mu.Unlock()
	return created, nil
}

// lockTimeout: the DDL waited past partitionLockTimeout for the table
// (busy with inserts); the next attempt usually gets it.
func lockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

func duplicate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P07" || pe.Code == "23505")
}

func (l *Ledger) ensure(ctx context.Context, from, to time.Time) ([]string, error) {
	have, err := l.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	exists := map[string]bool{}
	for _, p := range have {
		exists[p.Name] = true
	}
	var missing []Partition
	for d := from; !d.After(to); d = d.AddDate(0, 0, 1) {
		if p := partitionOf(d); !exists[p.Name] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	var created []string
	err = l.partitionTx(ctx, func(tx pgx.Tx) error {
		created = created[:0]
		for _, p := range missing {
			var stillMissing bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, l.qualified(p.Name)).Scan(&stillMissing); err != nil {
				return fmt.Errorf("looking for partition %s: %w", p.Name, err)
			}
			if !stillMissing {
				continue // made by another process while this one waited for the lock
			}
			// DDL takes no parameters: the name and the bounds are ours, built
			// from a date, and the name is quoted.
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+l.qualified(p.Name)+` PARTITION OF {schema}.meter_events
				FOR VALUES FROM ('`+p.From.Format("2006-01-02")+` 00:00:00+00') TO ('`+p.To.Format("2006-01-02")+` 00:00:00+00')`); err != nil {
				return fmt.Errorf("creating partition %s: %w", p.Name, err)
			}
			created = append(created, p.Name)
		}
		return nil
	})
	return created, err
}

// Prune drops the daily partitions that end before now - Retention (every
// event in them is older than Stripe takes) and returns their names. A
// drop is a file unlink, not a DELETE: it costs the same for any number of
// rows and leaves nothing to vacuum. It also deletes the per-customer
// monthly counts (meter_usage) older than the current month and the 12
// before it, and the finished aggregates as old as the dropped partitions.
func (l *Ledger) Prune(ctx context.Context, now time.Time) ([]string, error) {
	have, err := l.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	cutoff := now.Add(-Retention)
	var dropped []string
	for _, p := range have {
		if p.To.After(cutoff) {
			continue
		}
		err := l.partitionTx(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+l.qualified(p.Name))
			return err
		})
		if err != nil {
			return dropped, fmt.Errorf("dropping partition %s: %w", p.Name, err)
		}
		dropped = append(dropped, p.Name)
	}
	if _, err := l.pruneUsage(ctx, now); err != nil {
		return dropped, err
	}
	// Aggregates whose second is as old as the dropped partitions: their
	// members are gone with them (an aggregate still sending is kept).
	if _, err := l.pool.Exec(ctx, `DELETE FROM {schema}.meter_aggregates WHERE second < $1 AND status <> 'sending'`, cutoff); err != nil {
		return dropped, fmt.Errorf("pruning meter aggregates: %w", err)
	}
	return dropped, nil
}

// partitionTx runs DDL on meter_events' partitions under the schema's
// partition lock, waiting at most partitionLockTimeout for the table's.
func (l *Ledger) partitionTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		// pelguard's own runs wait for each other as long as ctx allows (a
		// run that makes 39 partitions on a loaded server takes seconds);
		// only the DDL's lock on the table, which waits behind inserts,
		// is bounded.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "pelguard.meter_partitions."+l.pool.Schema()); err != nil {
			return fmt.Errorf("locking meter_events' partitions: %w", err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+partitionLockTimeout+`'`); err != nil {
			return fmt.Errorf("setting lock_timeout: %w", err)
		}
		return fn(tx)
	})
}

func (l *Ledger) qualified(name string) string {
	return pgx.Identifier{l.pool.Schema(), name}.Sanitize()
}

// ensured reports whether this process knows ts's partition exists.
func (l *Ledger) ensured(ts time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !ts.Before(l.ensuredFrom) && ts.Before(l.ensuredTo)
}

// forgetPartitions makes the next Reserve that inserts ensure them again
// (a partition went missing: dropped by hand, or by a Prune on a clock far
// ahead).
func (l *Ledger) forgetPartitions() {
	l.mu.Lock()
	l.ensuredFrom, l.ensuredTo = time.Time{}, time.Time{}
	l.mu.Unlock()
}
