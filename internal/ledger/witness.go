package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Witness is the writer's row in ledger_witness (migration 00012): the
// ledger bumps it inside every transaction whose effect leaves Postgres (an
// XACK follows, a refund was made) and tells the witness the committed
// value, which the witness keeps outside Postgres (in memory, mirrored to
// Redis) before that effect. A committed value that Postgres later no
// longer has is proof that the ledger went back in time: a failover to a
// replica that had not received those commits, or a restore. See DESIGN.md
// "The ledger's own losses"; package internal/rollback keeps the witness.
type Witness interface {
	// Writer names this process's row: one row per process, so the bump
	// never waits on another process's transaction.
	Writer() string
	// Committed is told the row's value once the transaction that bumped
	// it has committed.
	Committed(seq int64)
}

// ServerFence is a Witness that also knows which Postgres server its last
// rollback check ran on (internal/rollback's Monitor). Behind a
// transaction-mode connection pooler a failover renews the pooler's server
// connections, not pelguard's, so the check pgx runs on each new connection
// never runs: instead the witness bump names the server its transaction
// ran on, and a transaction on a server the check has not seen is rolled
// back, the check runs, and the transaction is tried again. No ledger
// write commits on a new primary before the rollback check has run there.
type ServerFence interface {
	// CheckedServer identifies the server of the last check that passed
	// (pg_postmaster_start_time in microseconds; 0: no check yet).
	CheckedServer() int64
	// Recheck runs the rollback check now.
	Recheck(ctx context.Context) error
}

// ErrUncheckedServer is returned by BumpWitness when its transaction ran
// on a server the rollback check has not checked (a failover behind a
// pooler, or a restart): the transaction must not commit.
var ErrUncheckedServer = errors.New("the ledger's server changed since its last rollback check")

// ServerIdentitySQL is the server a statement runs on, as ServerFence
// compares it: its postmaster's start, in microseconds. A promoted replica,
// a restored copy and a restarted server each have another.
const ServerIdentitySQL = `(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint`

// SetWitness makes the ledger's outcome writes bump w's row. Call it before
// the ledger is used; nil (the default) bumps nothing.
func (l *Ledger) SetWitness(w Witness) { l.witness = w }

// witnessTx runs fn in a transaction that also bumps the witness row, last
// (the row is locked from the bump to the commit), and reports the value
// once committed.
func (l *Ledger) witnessTx(ctx context.Context, fn func(pgx.Tx) error) error {
	var seq int64
	attempt := func() error {
		return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			var err error
			seq, err = BumpWitness(ctx, tx, l.witness, l.clock.Now())
			return err
		})
	}
	err := attempt()
	if sf, ok := l.witness.(ServerFence); ok && errors.Is(err, ErrUncheckedServer) {
		// Rolled back: check the new server, then write once more (a
		// rollback the check finds is fenced before this write lands).
		if cerr := sf.Recheck(ctx); cerr != nil {
			return fmt.Errorf("%w; checking it: %w", err, cerr)
		}
		err = attempt()
	}
	if err == nil && seq > 0 {
		l.witness.Committed(seq)
	}
	return err
}

// BumpWitness bumps w's row in tx (a transaction of the ledger's pool, whose
// statements name {schema}) and returns the new value, for the caller to
// pass to w.Committed after the commit. A nil w bumps nothing and returns 0.
// Other packages' transactions with effects outside Postgres (the auditor's
// refunds) call it. now stamps the row: the repair after a rollback reads
// Stripe from the last surviving stamp.
func BumpWitness(ctx context.Context, tx pgx.Tx, w Witness, now time.Time) (int64, error) {
	if w == nil {
		return 0, nil
	}
	var seq, server int64
	err := tx.QueryRow(ctx, `INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at) VALUES ($1, 1, $2)
		ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $2
		RETURNING seq, `+ServerIdentitySQL, w.Writer(), now).Scan(&seq, &server)
	if err != nil {
		return 0, fmt.Errorf("bumping the ledger witness of %s: %w", w.Writer(), err)
	}
	if sf, ok := w.(ServerFence); ok {
		if checked := sf.CheckedServer(); checked != 0 && checked != server {
			return 0, fmt.Errorf("bumping the ledger witness of %s: %w", w.Writer(), ErrUncheckedServer)
		}
	}
	return seq, nil
}
