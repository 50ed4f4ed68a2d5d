package consumer_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Failure mode 2's other half: the process dies between the Stripe reply and
// XACK (a real SIGKILL of a real process). The redelivery makes no new charge
// and acks.
func TestKilledBetweenStripeReplyAndAck(t *testing.T) {
	t.Parallel()
	clk := clock.NewSimFollowing()
	b := setup(t, opts{clk: clk})
	e := ev(1)
	ids := b.add(t, e)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PELGUARD_CHILD=kill-after-stripe",
		"CHILD_REDIS_URL="+testenv.RedisURL(), "CHILD_DATABASE_URL="+b.dbURL, "CHILD_DB_SCHEMA="+testenv.SchemaOfURL(b.dbURL), "CHILD_STRIPE_URL="+b.sim.URL(),
		"CHILD_STREAM="+b.stream, "CHILD_GROUP="+b.group)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errorsAs(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child should die of SIGKILL, got %v: %s", err, out)
	}
	// The window the seed warns about: charged at Stripe, not in the ledger,
	// still in the PEL.
	if b.charges(e) != 1 || b.status(e) != ledger.StatusPending || b.pending(t) != 1 {
		t.Fatalf("after the kill: charges=%d status=%s pending=%d", b.charges(e), b.status(e), b.pending(t))
	}
	// The dead consumer's entry is taken over once its lease has expired.
	clk.Advance(2 * time.Second)
	p := processor(t, withClock(b.config(t, "consumer-B"), clk))
	msgs := b.claim(t, "consumer-B", ids...)
	got, err := p.Process(context.Background(), b.stream, msgs[0])
	if got != consumer.OutcomeCharged || err != nil {
		t.Fatalf("redelivery: %v %v", got, err)
	}
	if n := b.charges(e); n != 1 || b.sim.ChargeCreates() != 1 {
		t.Fatalf("%d charges, %d creates: the redelivery must reuse the first charge", n, b.sim.ChargeCreates())
	}
	if b.pending(t) != 0 || b.record(t, e).ChargeID != b.sim.Charges()[0].ID {
		t.Fatal("not acked, or the ledger does not name Stripe's charge")
	}
}

func withClock(c consumer.Config, clk clock.Clock) consumer.Config {
	c.Clock = clk
	return c
}

// Failure mode 3, AOF rollback: a Redis of the test's own with appendonly
// yes and appendfsync everysec. Events are processed and acked; Redis is
// then brought back to an earlier persisted state (what a crash losing the
// last second of writes, or a failover to a lagging replica, does), so the
// acked entries are pending again. The ledger says they are billed: acked
// again, no new charge.
func TestAOFRollback(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is needed for the AOF rollback test (make test installs it)")
	}
	b := setup(t, opts{})
	r := startRedis(t)
	b.rdb = r.client
	ctx := context.Background()
	if err := consumer.EnsureGroup(ctx, b.rdb, b.stream, b.group); err != nil {
		t.Fatal(err)
	}
	var evs []event.Event
	for i := range 20 {
		evs = append(evs, ev(i))
	}
	b.add(t, evs...)
	if got := len(b.read(t, "consumer-A", 20)); got != 20 { // delivered, pending
		t.Fatalf("read %d", got)
	}
	snapshot := r.snapshot(t) // the state a crash will roll back to

	cfg := b.config(t, "consumer-A") // pinned name: drains its own PEL first
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		n, _ := b.ledger.Counts(ctx)
		return n[ledger.StatusCharged] == 20 && b.pending(t) == 0
	}, "20 charged and acked")
	_ = c.Stop(ctx)

	r.crashAndRestore(t, snapshot)
	if got := b.pending(t); got != 20 {
		t.Fatalf("after the rollback %d entries are pending, want 20 (the test did not reproduce failure mode 3)", got)
	}
	c2 := start(t, b.config(t, "consumer-A"))
	_ = c2
	testenv.Eventually(t, 20*time.Second, func() bool { return b.pending(t) == 0 }, "rolled-back entries acked")
	if got := b.sim.ChargeCreates(); got != 20 {
		t.Fatalf("%d charge creates, want 20", got)
	}
	for _, e := range evs {
		if n := b.charges(e); n != 1 {
			t.Errorf("%s: %d charges", e.CustomerID, n)
		}
	}
}

type ownRedis struct {
	dir, port string
	cmd       *exec.Cmd
	client    *redis.Client
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

func startRedis(t *testing.T) *ownRedis {
	r := &ownRedis{dir: t.TempDir(), port: freePort(t)}
	r.launch(t)
	r.client = redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port, MaxRetries: -1})
	t.Cleanup(func() {
		_ = r.client.Close()
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	})
	return r
}

func (r *ownRedis) launch(t *testing.T) {
	r.cmd = exec.Command("redis-server", "--port", r.port, "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "")
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port})
	defer c.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }, "redis-server up")
}

// snapshot rewrites the AOF (so it holds the whole current state, fsynced)
// and copies it aside.
func (r *ownRedis) snapshot(t *testing.T) string {
	ctx := context.Background()
	if err := r.client.BgRewriteAOF(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		info, _ := r.client.Info(ctx, "persistence").Result()
		return strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") &&
			strings.Contains(info, "aof_last_bgrewrite_status:ok")
	}, "AOF rewrite done")
	snap := t.TempDir()
	copyDir(t, filepath.Join(r.dir, "appendonlydir"), filepath.Join(snap, "appendonlydir"))
	return snap
}

// crashAndRestore kills Redis without a shutdown save and restarts it from
// the snapshot's AOF.
func (r *ownRedis) crashAndRestore(t *testing.T, snap string) {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.cmd.Wait()
	if err := os.RemoveAll(filepath.Join(r.dir, "appendonlydir")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(snap, "appendonlydir"), filepath.Join(r.dir, "appendonlydir"))
	r.launch(t)
}

func copyDir(t *testing.T, from, to string) {
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

// An entry trimmed from the stream (XADD MAXLEN) while its Stripe call is in
// flight: the heartbeat must not drop it from the PEL or cancel the work;
// the charge is recorded and the entry acked.
func TestTrimmedWhileInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	_ = b.sim.SetFaults(simLatency(700 * time.Millisecond))
	e := ev(1)
	ids := b.add(t, e)
	cfg := b.config(t, "")
	cfg.Lease = 300 * time.Millisecond // heartbeats every 100 ms during the call
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusPending }, "call in flight")
	if err := b.rdb.XDel(context.Background(), b.stream, ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return b.status(e) == ledger.StatusCharged && b.pending(t) == 0 },
		"charged and acked although trimmed")
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges", n)
	}
}
