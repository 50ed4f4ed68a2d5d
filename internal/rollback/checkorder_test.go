package rollback

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// heldPool is the test's real pool, except that its first QueryRow holds
// once its row is read until the test releases it: a check slowed between
// its two reads, as a check on a loaded machine or behind a pooler is.
type heldPool struct {
	*pgxpool.Pool
	once          sync.Once
	read, release chan struct{}
}

func (p *heldPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return heldRow{row: p.Pool.QueryRow(ctx, sql, args...), p: p}
}

type heldRow struct {
	row pgx.Row
	p   *heldPool
}

func (r heldRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.p.once.Do(func() { close(r.p.read); <-r.p.release })
	return err
}

// Checks run at once (one per new connection, the periodic one, and behind
// a pooler one per write that met a new server). A check that read the
// rollbacks before another check detected and recorded one must not, when
// it finishes later, clear the suspicion: the process would charge
// without asking Stripe first while the ledger is missing rows.
func TestACheckThatReadBeforeADetectionDoesNotClearIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	m, err := New(Config{Schema: testenv.SchemaOf(pool), Writer: "consumer/a", Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.check(ctx, pool); err != nil || m.Suspect() {
		t.Fatalf("first check: %v, suspect %v", err, m.Suspect())
	}
	// The slow check reads the fence (no rollback recorded) and is held.
	slow := &heldPool{Pool: pool, read: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- m.check(ctx, slow) }()
	<-slow.read
	// This process saw a commit the ledger no longer has; the next check
	// detects the rollback, records it and raises the witness row.
	m.Committed(5)
	if err := m.check(ctx, pool); err != nil || !m.Suspect() {
		t.Fatalf("the detecting check: %v, suspect %v", err, m.Suspect())
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var open int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+testenv.SchemaOf(pool)+`.ledger_rollbacks WHERE repaired_at IS NULL`).Scan(&open); err != nil || open != 1 {
		t.Fatalf("%d open rollbacks (%v), want 1", open, err)
	}
	if !m.Suspect() {
		t.Fatal("a check that read before the detection cleared the suspicion while the rollback is open")
	}
}
