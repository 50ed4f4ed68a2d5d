package rollback

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
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

// A charged outcome whose transaction meets a server the monitor's last
// check did not run on (a failover behind a pooler) waits for the check:
// the check runs once, on that server, and is counted.
func TestAWriteOnAnUncheckedServerRunsTheCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	schema := testenv.SchemaOf(pool)
	m, err := New(Config{Schema: schema, Writer: "consumer/a", Logger: testenv.Logger(t), Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, pool); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	real := m.CheckedServer()
	m.server.Store(real + 1) // the last check ran on another server
	l := ledger.New(pool, schema, nil)
	l.SetWitness(m)
	e := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 100, Currency: "usd", BillingPeriod: "2026-11"}
	got, err := l.ReserveNew(ctx, []ledger.ReserveRequest{{Event: e, IdempotencyKey: e.Key("test"), Owner: "a", Lease: time.Minute, MessageID: "1-0"}})
	if err != nil || len(got) != 1 {
		t.Fatalf("reserve: %v %v", got, err)
	}
	done, err := l.FinishCharged(ctx, []ledger.Charged{{Record: got[ledger.EventKey(e)], ChargeID: "ch_1"}})
	if err != nil || !done[ledger.EventKey(e)] {
		t.Fatalf("the charged outcome on an unchecked server: %v %v", done, err)
	}
	if n := m.Rechecks(); n != 1 || m.CheckedServer() != real {
		t.Fatalf("%d rechecks, checked server %d; want 1 and the real server %d", n, m.CheckedServer(), real)
	}
}
