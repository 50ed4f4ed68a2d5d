// Package streamfacts keeps what every role of a stream must agree on as a
// fact of the stream, in the ledger, instead of a flag each process must
// repeat correctly (DESIGN.md invariant 14): the namespace inside every
// idempotency key and meter-event identifier (this file) and whether
// billing from the stream is paused (pause.go).
//
// A consumer, reaper, console or import that was given another namespace
// than the stream's would compute other keys for the same events: a
// reaper would find "no row" for a delivered meter event and send it again,
// a re-drive would dead-letter a good charge as conflicting_event. Check
// refuses to start such a role; the first role to use a stream records the
// namespace it runs with, after checking it against the rows already in the
// ledger, so an upgrade cannot lock in the wrong one.
package streamfacts

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/pg"
)

// Kind is what a stream carries.
type Kind string

const (
	Charges Kind = "charges" // billing events: idempotency keys (billing_records)
	Usage   Kind = "usage"   // meter events: identifiers (meter_events)
)

// DefaultNamespace is the namespace a role runs with when none is given
// (consumer.DefaultNamespace; repeated to keep this package below consumer).
const DefaultNamespace = "pelguard"

// sampleSize is how many ledger rows the first use of a stream checks its
// namespace against.
const sampleSize = 200

// Stream is a stream, the consumer group that reads it and what it carries.
type Stream struct {
	Name, Group string
	Kind        Kind
}

func (s Stream) String() string { return s.Name + "=" + s.Group }

// Check is one process's agreement with the fleet on its streams.
type Check struct {
	DB     *pgxpool.Pool
	Schema string
	// Redis, when set, lets the usage check read the stream entries of
	// sampled meter_events rows (an event_id is in the identifier but not
	// in the row).
	Redis     redis.UniversalClient
	Namespace string
	Streams   []Stream
	// Record: a stream with no recorded namespace gets this one (a dry run,
	// the console: false, they write nothing).
	Record bool
	// By names the process in the record ("reaper/host-123").
	By string
}

// MismatchError: the stream records another namespace than the process's.
type MismatchError struct {
	Stream          Stream
	Recorded, Given string
	RecordedBy      string
	RecordedAt      time.Time
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("stream %s records namespace %q (since %s, by %s) but this process runs with --namespace %q [PELGUARD_NAMESPACE]: "+
		"the namespace is part of every %s, so a role with another one would bill or send the same events again. "+
		"Start it with --namespace %s; if the stream's namespace itself must change, run "+
		"`pelguard-consumer namespace set --stream %s --group %s --namespace %s --reason \"...\"`",
		e.Stream, e.Recorded, e.RecordedAt.UTC().Format(time.RFC3339), e.RecordedBy, e.Given, what(e.Stream.Kind),
		e.Recorded, e.Stream.Name, e.Stream.Group, e.Given)
}

// UnprovenError: the stream has no recorded namespace and the ledger's rows
// were made under another one than the process's.
type UnprovenError struct {
	Stream           Stream
	Given            string
	Sampled, Matched int
	// Default counts sampled rows that match DefaultNamespace (when Given
	// is another).
	Default int
}

func (e *UnprovenError) Error() string {
	hint := ""
	if e.Default > 0 {
		hint = fmt.Sprintf(" (%d of them match the default namespace %q: was this fleet run without --namespace?)", e.Default, DefaultNamespace)
	}
	return fmt.Sprintf("stream %s has no recorded namespace yet and none of the %d %s checked was made under --namespace %q%s: "+
		"recording it would lock in the wrong one. Start with the namespace the fleet has been running with; "+
		"if %q is right, record it explicitly with `pelguard-consumer namespace set --stream %s --group %s --kind %s --namespace %s --reason \"...\"`",
		e.Stream, e.Sampled, rows(e.Stream.Kind), e.Given, hint, e.Given, e.Stream.Name, e.Stream.Group, e.Stream.Kind, e.Given)
}

// ErrDisagree is matched (errors.Is) by both errors above.
var ErrDisagree = errors.New("the stream's namespace disagrees")

func (e *MismatchError) Is(target error) bool { return target == ErrDisagree }
func (e *UnprovenError) Is(target error) bool { return target == ErrDisagree }

func what(k Kind) string {
	if k == Usage {
		return "meter event's identifier"
	}
	return "charge's idempotency key"
}

func rows(k Kind) string {
	if k == Usage {
		return "recent meter_events rows"
	}
	return "billing_records rows"
}

// Fact is a stream's recorded namespace.
type Fact struct {
	Stream     Stream
	Namespace  string
	RecordedAt time.Time
	RecordedBy string
}

// Run checks every stream: nil when each records c.Namespace (or, without a
// record, the ledger agrees with it; then it is recorded when c.Record).
func (c Check) Run(ctx context.Context) error {
	db := pg.NewDB(c.DB, c.Schema)
	for _, s := range c.Streams {
		f, ok, err := Read(ctx, c.DB, c.Schema, s)
		if err != nil {
			return err
		}
		if !ok {
			sampled, matched, def, err := c.sample(ctx, db, s)
			if err != nil {
				return err
			}
			if sampled > 0 && matched == 0 {
				return &UnprovenError{Stream: s, Given: c.Namespace, Sampled: sampled, Matched: matched, Default: def}
			}
			if !c.Record {
				continue
			}
			if f, err = record(ctx, db, s, c.Namespace, c.By); err != nil {
				return err
			}
		}
		if f.Namespace != c.Namespace {
			return &MismatchError{Stream: s, Recorded: f.Namespace, Given: c.Namespace, RecordedBy: f.RecordedBy, RecordedAt: f.RecordedAt}
		}
	}
	return nil
}

// Read returns the stream's recorded namespace, if any.
func Read(ctx context.Context, pool *pgxpool.Pool, schema string, s Stream) (Fact, bool, error) {
	f := Fact{Stream: s}
	err := pg.NewDB(pool, schema).QueryRow(ctx, `SELECT kind, namespace, recorded_at, recorded_by FROM {schema}.stream_namespaces
		WHERE stream = $1 AND consumer_group = $2`, s.Name, s.Group).Scan(&f.Stream.Kind, &f.Namespace, &f.RecordedAt, &f.RecordedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("reading the namespace of stream %s: %w", s, err)
	}
	return f, true, nil
}

// List returns every recorded namespace.
func List(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Fact, error) {
	rs, err := pg.NewDB(pool, schema).Query(ctx, `SELECT stream, consumer_group, kind, namespace, recorded_at, recorded_by
		FROM {schema}.stream_namespaces ORDER BY stream, consumer_group`)
	if err != nil {
		return nil, fmt.Errorf("reading the streams' namespaces: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Fact, error) {
		var f Fact
		err := r.Scan(&f.Stream.Name, &f.Stream.Group, &f.Stream.Kind, &f.Namespace, &f.RecordedAt, &f.RecordedBy)
		return f, err
	})
}

// record inserts the stream's first namespace (the first role wins a race:
// the loser reads the winner's and compares), with its change row.
func record(ctx context.Context, db pg.DB, s Stream, namespace, by string) (Fact, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return Fact{}, fmt.Errorf("recording the namespace of stream %s: %w", s, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `INSERT INTO {schema}.stream_namespaces (stream, consumer_group, kind, namespace, recorded_by)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, s.Name, s.Group, s.Kind, namespace, by)
	if err != nil {
		return Fact{}, fmt.Errorf("recording the namespace of stream %s: %w", s, err)
	}
	if tag.RowsAffected() == 1 {
		if _, err := tx.Exec(ctx, `INSERT INTO {schema}.stream_fact_changes (stream, consumer_group, fact, new_value, actor, reason)
			VALUES ($1, $2, 'namespace', $3, $4, 'first use of the stream; checked against the ledger''s rows')`, s.Name, s.Group, namespace, by); err != nil {
			return Fact{}, fmt.Errorf("recording the namespace of stream %s: %w", s, err)
		}
	}
	f := Fact{Stream: s}
	if err := tx.QueryRow(ctx, `SELECT kind, namespace, recorded_at, recorded_by FROM {schema}.stream_namespaces
		WHERE stream = $1 AND consumer_group = $2`, s.Name, s.Group).Scan(&f.Stream.Kind, &f.Namespace, &f.RecordedAt, &f.RecordedBy); err != nil {
		return Fact{}, fmt.Errorf("reading the namespace of stream %s: %w", s, err)
	}
	return f, tx.Commit(ctx)
}

// Set records namespace for the stream whatever it was (the explicit,
// audited change: `pelguard-consumer namespace set`), and returns the old
// one ("" when there was none).
func Set(ctx context.Context, pool *pgxpool.Pool, schema string, s Stream, namespace, actor, reason string) (old string, err error) {
	db := pg.NewDB(pool, schema)
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("setting the namespace of stream %s: %w", s, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var prev *string
	if err := tx.QueryRow(ctx, `SELECT namespace FROM {schema}.stream_namespaces WHERE stream = $1 AND consumer_group = $2 FOR UPDATE`,
		s.Name, s.Group).Scan(&prev); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("setting the namespace of stream %s: %w", s, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO {schema}.stream_namespaces (stream, consumer_group, kind, namespace, recorded_by)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (stream, consumer_group) DO UPDATE SET namespace = EXCLUDED.namespace, kind = EXCLUDED.kind,
			recorded_at = now(), recorded_by = EXCLUDED.recorded_by`, s.Name, s.Group, s.Kind, namespace, actor); err != nil {
		return "", fmt.Errorf("setting the namespace of stream %s: %w", s, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO {schema}.stream_fact_changes (stream, consumer_group, fact, old_value, new_value, actor, reason)
		VALUES ($1, $2, 'namespace', $3, $4, $5, $6)`, s.Name, s.Group, prev, namespace, actor, reason); err != nil {
		return "", fmt.Errorf("setting the namespace of stream %s: %w", s, err)
	}
	if prev != nil {
		old = *prev
	}
	return old, tx.Commit(ctx)
}
