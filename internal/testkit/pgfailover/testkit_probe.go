package pgfailover

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is what the probes need: a *pgx.Conn, *pgxpool.Pool or pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LSN is a WAL position (pg_lsn), comparable with < and subtractable.
type LSN uint64

// ParseLSN reads Postgres's "X/Y" text form.
func ParseLSN(s string) (LSN, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
	}
	return LSN(uint64(hi)<<32 | uint64(lo)), nil
}

func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// TimelineID is the server's timeline as of its last checkpoint
// (pg_control_checkpoint()). A promotion starts a new, higher timeline;
// Promote checkpoints so that this reports it at once, but a server
// promoted by other means reports the old timeline until its first
// checkpoint after promotion.
func TimelineID(ctx context.Context, q Querier) (uint32, error) {
	var tli int64
	if err := q.QueryRow(ctx, "SELECT timeline_id FROM pg_control_checkpoint()").Scan(&tli); err != nil {
		return 0, fmt.Errorf("reading timeline_id from pg_control_checkpoint(): %w", err)
	}
	return uint32(tli), nil
}

// CurrentWALLSN is pg_current_wal_lsn(): how far the primary has written
// WAL. It fails on a server in recovery.
func CurrentWALLSN(ctx context.Context, q Querier) (LSN, error) {
	var s string
	if err := q.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("reading pg_current_wal_lsn(): %w", err)
	}
	return ParseLSN(s)
}

// Replication is how a primary acknowledges commits relative to its
// standbys.
type Replication struct {
	SynchronousCommit       string // synchronous_commit: on, remote_apply, remote_write, local, off
	SynchronousStandbyNames string // synchronous_standby_names: "" means every standby is asynchronous
}

// Asynchronous reports whether a commit can return before any standby has
// it: no synchronous standby named, or synchronous_commit local or off.
func (r Replication) Asynchronous() bool {
	return r.SynchronousStandbyNames == "" || r.SynchronousCommit == "local" || r.SynchronousCommit == "off"
}

// ReplicationSettings reads the session's synchronous_commit and the
// server's synchronous_standby_names.
func ReplicationSettings(ctx context.Context, q Querier) (Replication, error) {
	var r Replication
	err := q.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')").
		Scan(&r.SynchronousCommit, &r.SynchronousStandbyNames)
	if err != nil {
		return r, fmt.Errorf("reading synchronous_commit and synchronous_standby_names: %w", err)
	}
	return r, nil
}
