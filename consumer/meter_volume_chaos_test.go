package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// The volume scenarios under chaos (meter_volume_test.go runs them): the
// load of volumeBusyCustomer with consumers SIGKILLed and replaced, the
// group rolled back to 0, or the producer re-publishing what it sent.
// Each time every event is counted exactly once (assertVolumeExact).

// runLedgerMeterChild is a meter consumer process sending from the ledger
// with the sum meter aggregated (PELGUARD_CHILD=ledger-meter-consumer) that
// runs until the test kills it.
func runLedgerMeterChild() int {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("CHILD_REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	pool, err := pg.Open(ctx, os.Getenv("CHILD_DATABASE_URL"), 6)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: os.Getenv("CHILD_STRIPE_URL"), MaxNetworkRetries: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: redis.NewClient(opt), DB: pool,
		Schema: os.Getenv("CHILD_DB_SCHEMA"), Stripe: sc, Stream: os.Getenv("CHILD_STREAM"), Group: os.Getenv("CHILD_GROUP"),
		Name: os.Getenv("CHILD_NAME"), Namespace: "test", Lease: 2 * time.Second, Block: 50 * time.Millisecond,
		SendFromLedger: true, AggregateMeters: []string{meterName}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// Two consumer processes SIGKILLed and each replaced by a process of a
// new name, as a restarted pod would be; the reaper re-drives what a dead
// one left pending. Every other kill takes both processes at once while an
// aggregate of the busy customer is held in flight at the emulator (it is
// then counted there, and its reply never read); the others take one
// process at a random moment (mid-ingest before XACK, between an
// aggregate's formation and its call, ...). An aggregate left sending is
// taken over once its lease expires and re-sent under its identifier:
// Stripe refuses the one it counted as a duplicate (or replays its answer),
// and it is recorded delivered with its members.
func volumeUnderSIGKILLs(t *testing.T) {
	var armed atomic.Bool
	hit, released := make(chan struct{}), make(chan struct{})
	b := volumeWorld(t, func(customer, _ string) {
		if customer == "cus_0" && armed.CompareAndSwap(true, false) {
			hit <- struct{}{}
			<-released
		}
	})
	outs := map[*exec.Cmd]*strings.Builder{}
	start := func(name string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PELGUARD_CHILD=ledger-meter-consumer", "CHILD_NAME="+name,
			"CHILD_REDIS_URL="+testenv.RedisURL(), "CHILD_DATABASE_URL="+b.dbURL, "CHILD_DB_SCHEMA="+testenv.SchemaOfURL(b.dbURL),
			"CHILD_STRIPE_URL="+b.sim.URL(), "CHILD_STREAM="+b.stream, "CHILD_GROUP="+b.group)
		out := &strings.Builder{}
		cmd.Stderr, outs[cmd] = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// kill SIGKILLs a child, which must still be running: one that
	// stopped by itself did none of the work this test counts on.
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("a meter consumer process had stopped before its kill (%s): %s", cmd.ProcessState, outs[cmd].String())
		}
	}
	var mu sync.Mutex
	fleet := []*exec.Cmd{start("v-0"), start("v-1")}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range fleet {
			kill(c)
		}
	}()
	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		MeterStreams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, MeterStripe: b.stripe,
		Name: "reaper-volume", MinIdle: time.Second, Interval: 200 * time.Millisecond,
		Namespace: "test", Lease: 2 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()

	// A kill every 3-5 s from the second second on (seven or so while 30 s
	// of load runs), then two while what is left is sent.
	rng := rand.New(rand.NewPCG(38, 1))
	kills := 0
	inFlightKills := 0
	killOne := func() {
		mu.Lock()
		defer mu.Unlock()
		kills++
		if kills%2 == 1 {
			i := rng.IntN(len(fleet))
			kill(fleet[i])
			fleet[i] = start(fmt.Sprintf("v-%d-%d", i, kills))
			return
		}
		// Both at once, a call of the busy customer's in flight.
		armed.Store(true)
		select {
		case <-hit:
		case <-time.After(10 * time.Second):
			if armed.CompareAndSwap(true, false) {
				t.Log("no call of the busy customer in flight within 10 s: killed at a random moment instead")
				for i := range fleet {
					kill(fleet[i])
					fleet[i] = start(fmt.Sprintf("v-%d-%d", i, kills))
				}
				return
			}
			<-hit // the hook took it just now
		}
		for i := range fleet {
			kill(fleet[i])
			fleet[i] = start(fmt.Sprintf("v-%d-%d", i, kills))
		}
		inFlightKills++
		released <- struct{}{}
	}
	next := 10 + rng.IntN(8)
	all := b.produceVolume(t, func(k int, _ []event.MeterEvent) {
		if k == next {
			killOne()
			next += 30 + rng.IntN(20)
		}
	})
	for range 2 {
		time.Sleep(time.Duration(1200+rng.IntN(800)) * time.Millisecond) // chaos timing, not synchronisation
		killOne()
	}
	c := b.assertVolumeExact(t, all)
	t.Logf("%d SIGKILLs, %d of both processes with an aggregate in flight", kills, inFlightKills)
	// An aggregate killed in flight was counted at the emulator; it is
	// sent again under its identifier, answered from the first (Stripe's
	// idempotent replay of the same Idempotency-Key, or a duplicate
	// refusal), and counted once.
	if c.posts-c.counts.Recorded < int64(inFlightKills) || c.retries < inFlightKills {
		t.Errorf("each of the %d aggregates whose call was killed in flight must have been sent again: %s", inFlightKills, c)
	}
}

// The group rolled back to 0 (XGROUP SETID ... 0) twice while the load
// runs and once after: every entry is delivered again; the ledger knows
// each event (queued, sending or delivered) and acks it without a second
// row, aggregate or call.
func volumeWithTheGroupRolledBack(t *testing.T) {
	b := volumeWorld(t, nil)
	b.runLedgerConsumers(t, 3*time.Second, "v-a", "v-b")
	rollback := func() {
		if err := b.rdb.XGroupSetID(context.Background(), b.stream, b.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	all := b.produceVolume(t, func(k int, _ []event.MeterEvent) {
		if n := volumeSeconds() * 10; k == n/3 || k == 2*n/3 {
			rollback()
		}
	})
	// Once the stream has been read to its end again, roll back once more:
	// its last seconds' aggregates may still be forming or in flight.
	testenv.Eventually(t, 60*time.Second, func() bool { return b.drained(t) }, "the stream was not read to its end")
	rollback()
	b.assertVolumeExact(t, all)
}

// The producer re-publishes events it already sent (a retry after a
// timeout, a replay from its own log): same event id, so the same
// identifier, on new entries. Part of the load is re-published while it
// runs (some of it queued, some in an aggregate in flight, some
// delivered) and all of it once more at the end; each event is still
// counted once, in one aggregate.
func volumeWithEventsRepublished(t *testing.T) {
	b := volumeWorld(t, nil)
	b.runLedgerConsumers(t, 3*time.Second, "v-a", "v-b")
	rng := rand.New(rand.NewPCG(38, 3))
	all := b.produceVolume(t, func(k int, sofar []event.MeterEvent) {
		if n := volumeSeconds() * 10; k == n/3 || k == 2*n/3 {
			again := append([]event.MeterEvent{}, sofar...)
			rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
			b.publish(t, again[:len(again)/2])
		}
	})
	b.publish(t, all)
	b.assertVolumeExact(t, all)
}
