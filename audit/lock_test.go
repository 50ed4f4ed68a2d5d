package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func (b *bundle) db() pg.DB { return pg.NewDB(b.pool, testenv.SchemaOf(b.pool)) }

// leaseRow is the lease's holder and epoch ("" when free).
func (b *bundle) leaseRow(t testing.TB, name string) (owner string, epoch int64) {
	t.Helper()
	err := b.db().QueryRow(context.Background(), `SELECT coalesce(owner, ''), epoch FROM {schema}.run_leases WHERE name = $1`, name).Scan(&owner, &epoch)
	if err != nil {
		t.Fatalf("reading lease %s: %v", name, err)
	}
	return owner, epoch
}

// A run that was killed leaves its lease row behind, held: the next run
// skips while it is live (naming the holder), waits for it with LockWait,
// and takes it over once it has expired. Every run, refund and usage run
// frees its lease when done.
func TestKilledRunsLeaseExpiresAndTheNextRunTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	ctx := context.Background()
	// What a SIGKILLed holder leaves: a live lease nobody renews.
	if _, err := b.db().Exec(ctx, `INSERT INTO {schema}.run_leases (name, owner, epoch, acquired_at, heartbeat_at, expires_at)
		VALUES ('audit_run', 'dead-host:4242:x', 7, now(), now(), clock_timestamp() + interval '3 seconds')`); err != nil {
		t.Fatal(err)
	}
	skipper := b.auditor(t, nil)
	_, err := skipper.Run(ctx, Window{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "dead-host:4242:x") {
		t.Fatalf("run while a killed run's lease is live: %v, want ErrLocked naming the holder", err)
	}
	waiter := b.auditor(t, func(c *Config) { c.LockWait = time.Minute })
	if _, err := waiter.Run(ctx, Window{}); err != nil {
		t.Fatalf("run waiting for the killed run's lease to expire: %v", err)
	}
	if owner, epoch := b.leaseRow(t, lockRun); owner != "" || epoch != 8 {
		t.Fatalf("after the run: owner %q epoch %d, want free at epoch 8 (taken over once)", owner, epoch)
	}
	if _, err := waiter.Refund(ctx, RefundOptions{MaxRefunds: 10, MaxCents: 100_000}); err != nil {
		t.Fatal(err)
	}
	if owner, _ := b.leaseRow(t, lockRefund); owner != "" {
		t.Fatalf("the refund run left its lease held by %q", owner)
	}
}

// A holder whose lease is taken over (its heartbeat finds another owner)
// has its context cancelled with ErrLeaseLost.
func TestLostLeaseCancelsTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l, err := acquireLock(ctx, b.db(), "test_lock", MinLockLease, 0, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	if _, err := acquireLock(ctx, b.db(), "test_lock", MinLockLease, 0, testenv.Logger(t)); !errors.Is(err, ErrLocked) {
		t.Fatalf("second holder: %v, want ErrLocked", err)
	}
	if _, err := b.db().Exec(ctx, `UPDATE {schema}.run_leases SET owner = 'thief', epoch = epoch + 1 WHERE name = 'test_lock'`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the holder's context is still live 30s after its lease was taken over")
	}
	if !errors.Is(context.Cause(l.ctx), ErrLeaseLost) || l.lost() == nil {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(l.ctx))
	}
	l.release()
	if owner, _ := b.leaseRow(t, "test_lock"); owner != "thief" {
		t.Fatalf("the holder that lost its lease released its successor's: owner %q", owner)
	}
}

// A refund run whose lease was taken over before its refund (the
// heartbeat has not noticed yet) makes no refund: the refund's own
// transaction checks the lease.
func TestRefundStopsWhenItsLeaseIsLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, dup := b.pair(t, "c1", 2500)
	ctx := context.Background()
	a := b.auditor(t, func(c *Config) {
		c.Test.BeforeRefund = func(Finding) {
			if _, err := b.db().Exec(context.Background(), `UPDATE {schema}.run_leases SET owner = 'thief', epoch = epoch + 1 WHERE name = 'refund'`); err != nil {
				t.Error(err)
			}
		}
	})
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	_, err := a.Refund(ctx, RefundOptions{MaxRefunds: 10, MaxCents: 100_000})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("refund after its lease was taken over: %v, want ErrLeaseLost", err)
	}
	if n := len(b.refunds(t)); n != 0 || b.refundLedger(t) != 0 {
		t.Fatalf("%d refunds at Stripe, %d refund_ledger rows; want none", n, b.refundLedger(t))
	}
	if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 0 {
		t.Fatalf("the duplicate was refunded (%d)", ch.AmountRefunded)
	}
}

// No run leaves a Postgres lock in any of the pool's connections: the
// locks are rows, so a pooler that hands a server connection on can never
// hand a lock on with it.
func TestRunsLeaveNoSessionLockInThePool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	ctx := context.Background()
	a := b.auditor(t, func(c *Config) { c.AutoRefund = true })
	for range 2 {
		if _, err := a.Run(ctx, Window{}); err != nil && !errors.Is(err, ErrEmptyWindow) {
			t.Fatal(err)
		}
	}
	conns := b.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	if len(conns) == 0 {
		t.Fatal("no idle connection to inspect")
	}
	for _, c := range conns {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("connection (pid %d) holds %d advisory locks after the runs", c.Conn().PgConn().PID(), n)
		}
	}
	for _, name := range []string{lockRun, lockRefund} {
		if owner, _ := b.leaseRow(t, name); owner != "" {
			t.Fatalf("lease %s still held by %s", name, owner)
		}
	}
}
