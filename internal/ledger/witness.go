package ledger

import (
	"context"
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

// SetWitness makes the ledger's outcome writes bump w's row. Call it before
// the ledger is used; nil (the default) bumps nothing.
func (l *Ledger) SetWitness(w Witness) { l.witness = w }

// witnessTx runs fn in a transaction that also bumps the witness row, last
// (the row is locked from the bump to the commit), and reports the value
// once committed.
func (l *Ledger) witnessTx(ctx context.Context, fn func(pgx.Tx) error) error {
	var seq int64
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		var err error
		seq, err = BumpWitness(ctx, tx, l.witness, l.clock.Now())
		return err
	})
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
	var seq int64
	err := tx.QueryRow(ctx, `INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at) VALUES ($1, 1, $2)
		ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $2
		RETURNING seq`, w.Writer(), now).Scan(&seq)
	if err != nil {
		return 0, fmt.Errorf("bumping the ledger witness of %s: %w", w.Writer(), err)
	}
	return seq, nil
}
