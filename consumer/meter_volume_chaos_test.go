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
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// Usage at volume under chaos, sent per event from the ledger
// (SendFromLedger, no aggregates): a busy customer at 100 events/s for
// 5 s beside 40 quiet customers at 1 event/s each, Stripe answering in
// 50 ms, two consumers; and consumers SIGKILLed and replaced, the group
// rolled back to 0, or the producer re-publishing what it sent. Each time:
// every event counted exactly once at the emulator (one recorded event per
// identifier, none missing, none extra), the ledger's delivered rows equal
// to the events produced, and the stream drained (nothing pending, lag 0).
//
// The busy customer's events go to four meters (one sum, three count),
// 25 events/s each, above what one customer-meter's calls drain at 50 ms
// (at most 20/s; 3-10/s measured with the machine loaded): a backlog grows
// while the load runs and drains after it. A per-event send is one call
// at a time per customer and meter, so one meter at 100 events/s would
// need 25 s of calls for 5 s of load by itself, 10-20 s of load a minute
// or more: past what a test should take. Above one event per call latency
// a customer-meter's backlog does not catch up by itself
// (docs/operations/meter-events.md); these tests are about exactness under
// chaos, not that ceiling.

// volumeCountMeters are the busy customer's count meters, beside meterName.
var volumeCountMeters = []string{"api_calls", "tokens_calls", "jobs_run"}

const (
	volumeSeconds     = 5
	volumeBusyPerTick = 10 // per 100 ms: 100 events/s
	volumeQuiet       = 40 // customers at 1 event/s each
	volumeLatency     = 50 * time.Millisecond
	// volumeDrainBound is how long after the last event every event must be
	// counted and the stream drained: generous, for a loaded machine.
	volumeDrainBound = 90 * time.Second
)

// volumeWorld is meterWorld with the busy customer's count meters and
// Stripe answering each meter event in volumeLatency.
func volumeWorld(t *testing.T) *bundle {
	t.Helper()
	return volumeWorldWith(t, nil)
}

// volumeWorldWith is volumeWorld with a hook on every meter event call
// while it is in flight at the emulator.
func volumeWorldWith(t *testing.T, onMeterCall func(customer, eventName string)) *bundle {
	t.Helper()
	b := setup(t, opts{simNow: time.Now().UTC(), onMeterCall: onMeterCall})
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	for _, m := range volumeCountMeters {
		if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: m, Formula: stripesim.FormulaCount}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: volumeLatency}); err != nil {
		t.Fatal(err)
	}
	return b
}

// volumeTick is the events of tick k (100 ms): the busy customer's
// (cus_0, across its four meters) and the quiet customers' whose turn it
// is (each once a second).
func volumeTick(k int, at time.Time) []event.MeterEvent {
	meters := append([]string{meterName}, volumeCountMeters...)
	var evs []event.MeterEvent
	for i := range volumeBusyPerTick {
		n := k*volumeBusyPerTick + i
		e := meterEvent(0, n, at.Add(time.Duration(i)*time.Millisecond))
		e.EventName = meters[n%len(meters)]
		evs = append(evs, e)
	}
	for q := 1; q <= volumeQuiet; q++ {
		if q%10 == k%10 {
			evs = append(evs, meterEvent(q, k/10, at))
		}
	}
	return evs
}

// publish adds evs to the stream in one pipeline (the producer).
func (b *bundle) publish(t *testing.T, evs []event.MeterEvent) {
	t.Helper()
	if len(evs) == 0 {
		return
	}
	_, err := b.rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
		for _, e := range evs {
			p.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// produceVolume publishes volumeSeconds of load, a tick every 100 ms,
// calling chaos (if any) after each tick with the tick's number and what
// was produced so far. It returns the events produced (each once).
func (b *bundle) produceVolume(t *testing.T, chaos func(k int, sofar []event.MeterEvent)) []event.MeterEvent {
	t.Helper()
	var all []event.MeterEvent
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for k := range volumeSeconds * 10 {
		<-tick.C
		evs := volumeTick(k, time.Now().UTC())
		b.publish(t, evs)
		all = append(all, evs...)
		if chaos != nil {
			chaos(k, all)
		}
	}
	return all
}

// recordedOnce reports whether the emulator has recorded every one of
// evs's identifiers (and how many it has recorded in all).
func (b *bundle) recordedOnce(evs []event.MeterEvent) bool {
	return b.sim.MeterEventCounts().Recorded >= int64(len(evs))
}

// drained reports whether the group has nothing pending and nothing
// unread (lag 0: it has read up to the stream's last entry).
func (b *bundle) drained(t *testing.T) bool {
	t.Helper()
	if b.pending(t) != 0 {
		return false
	}
	gs, err := b.rdb.XInfoGroups(context.Background(), b.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Name == b.group {
			return g.Lag == 0 && g.Pending == 0
		}
	}
	t.Fatalf("group %s not found", b.group)
	return false
}

func (b *bundle) ledgerCounts(t *testing.T) map[meterledger.Status]int64 {
	t.Helper()
	now := time.Now()
	counts, err := b.meterLedger(t).Counts(context.Background(), now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

// assertVolumeExact waits (volumeDrainBound) until the emulator has
// recorded as many events as were produced, the ledger has as many
// delivered rows and the stream is drained; then checks every event was
// counted exactly once: one recorded, uncancelled event per identifier,
// none missing and none the producer did not send, no call refused for
// another of its customer-meter's in flight.
func (b *bundle) assertVolumeExact(t *testing.T, all []event.MeterEvent) {
	t.Helper()
	last := time.Now()
	n := int64(len(all))
	testenv.Eventually(t, volumeDrainBound, func() bool {
		return b.recordedOnce(all) && b.ledgerCounts(t)[meterledger.StatusDelivered] >= n && b.drained(t)
	}, "not counted and drained within %s of the last event: emulator %+v, ledger %v, %d pending",
		volumeDrainBound, b.sim.MeterEventCounts(), b.ledgerCounts(t), b.pending(t))
	t.Logf("%d events (%d of the busy customer) counted and the stream drained %s after the last; emulator %+v",
		n, volumeSeconds*10*volumeBusyPerTick, time.Since(last).Round(time.Millisecond), b.sim.MeterEventCounts())
	want := map[string]event.MeterEvent{}
	for _, e := range all {
		want[e.Identifier("test")] = e
	}
	if len(want) != len(all) {
		t.Fatalf("the load has %d distinct identifiers for %d events", len(want), len(all))
	}
	seen := map[string]int{}
	for _, r := range b.sim.MeterEvents("", "") {
		if r.Cancelled {
			continue
		}
		seen[r.Identifier]++
		e, ok := want[r.Identifier]
		switch {
		case !ok:
			t.Errorf("the emulator counted %s (%s, %s), which the producer never sent", r.Identifier, r.EventName, r.Customer)
		case r.Customer != e.StripeCustomerID || r.EventName != e.EventName || r.Value != e.Value:
			t.Errorf("%s counted as %s/%s/%d, produced as %s/%s/%d", r.Identifier, r.Customer, r.EventName, r.Value,
				e.StripeCustomerID, e.EventName, e.Value)
		}
	}
	for id, e := range want {
		if seen[id] != 1 {
			t.Errorf("%s (%s of %s) counted %d times, want once", id, e.EventName, e.StripeCustomerID, seen[id])
		}
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != n || c.Concurrent != 0 {
		t.Errorf("emulator %+v: want %d recorded, none refused for a call of its customer-meter in flight", c, n)
	}
	if counts := b.ledgerCounts(t); counts[meterledger.StatusDelivered] != n || len(counts) != 1 {
		t.Errorf("ledger %v: want %d delivered and nothing else", counts, n)
	}
	if !b.drained(t) {
		t.Errorf("the stream is no longer drained (%d pending)", b.pending(t))
	}
}

// runLedgerConsumers runs consumers named names, sending from the ledger,
// until the test ends.
func (b *bundle) runLedgerConsumers(t *testing.T, names ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range names {
		c := b.ledgerMeterConsumer(t, name)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// runLedgerMeterChild is a meter consumer process sending from the ledger
// (PELGUARD_CHILD=ledger-meter-consumer) that runs until the test kills it.
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
		SendFromLedger: true})
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

// (a) Two consumer processes SIGKILLed and each replaced by a process of a
// new name, as a restarted pod would be; the reaper re-drives what a dead
// one left pending. Every other kill takes both processes at once while a
// call of the busy customer is held in flight at the emulator (it is then
// counted there, and its reply never read); the others take one process
// at a random moment (mid-ingest before XACK, between a reservation and
// its call, ...). A row left sending is taken over once its lease
// expires, under its identifier: Stripe refuses the one it counted as a
// duplicate, and it is recorded delivered.
func TestVolumeFromTheLedgerUnderSIGKILLs(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	hit, released := make(chan struct{}), make(chan struct{})
	b := volumeWorldWith(t, func(customer, _ string) {
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

	// A kill every 1.2-2 s from the second second on (two or three
	// while the load runs), then two while the backlog drains.
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
			next += 12 + rng.IntN(8)
		}
	})
	for range 2 {
		time.Sleep(time.Duration(1200+rng.IntN(800)) * time.Millisecond) // chaos timing, not synchronisation
		killOne()
	}
	b.assertVolumeExact(t, all)
	var again int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+testenv.SchemaOf(b.pool)+`.meter_events WHERE attempts > 1`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	c := b.sim.MeterEventCounts()
	posts := b.sim.Requests()["POST /v1/billing/meter_events"]
	t.Logf("%d SIGKILLs, %d of both processes with a call in flight; %d events taken over after a kill; %d calls for %d events counted",
		kills, inFlightKills, again, posts, c.Recorded)
	// A call killed in flight was counted at the emulator; its event is
	// sent again under its identifier, answered from the first (Stripe's
	// idempotent replay of the same Idempotency-Key, or a duplicate
	// refusal), and counted once.
	if posts < c.Recorded+int64(inFlightKills) || again < inFlightKills {
		t.Errorf("%d calls for %d events, %d taken over: each of the %d events whose call was killed in flight must have been sent again",
			posts, c.Recorded, again, inFlightKills)
	}
}

// (b) The group rolled back to 0 (XGROUP SETID ... 0) twice while the load
// runs and once while the backlog drains: every entry is delivered again;
// the ledger knows each event (queued, sending or delivered) and acks it
// without a second row or call.
func TestVolumeFromTheLedgerWithTheGroupRolledBack(t *testing.T) {
	t.Parallel()
	b := volumeWorld(t)
	b.runLedgerConsumers(t, "v-a", "v-b")
	rollback := func() {
		if err := b.rdb.XGroupSetID(context.Background(), b.stream, b.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	all := b.produceVolume(t, func(k int, _ []event.MeterEvent) {
		if k == 15 || k == 35 {
			rollback()
		}
	})
	// Once the stream has been read to its end again, roll back once more
	// while the busy customer's backlog is still being sent.
	testenv.Eventually(t, 30*time.Second, func() bool { return b.drained(t) }, "the stream was not read to its end (%d pending)", b.pending(t))
	if b.recordedOnce(all) {
		t.Log("everything was counted before the last rollback: it re-delivers only delivered events")
	}
	rollback()
	b.assertVolumeExact(t, all)
}

// (c) The producer re-publishes events it already sent (a retry after a
// timeout, a replay from its own log): same event id, so the same
// identifier, on new entries. Part of the load is re-published while it
// runs (some of it queued, some sending, some delivered) and all of it
// once more at the end; each event is still counted once.
func TestVolumeFromTheLedgerWithEventsRepublished(t *testing.T) {
	t.Parallel()
	b := volumeWorld(t)
	b.runLedgerConsumers(t, "v-a", "v-b")
	rng := rand.New(rand.NewPCG(38, 3))
	all := b.produceVolume(t, func(k int, sofar []event.MeterEvent) {
		if k == 20 || k == 40 {
			again := append([]event.MeterEvent{}, sofar...)
			rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
			b.publish(t, again[:len(again)/2])
		}
	})
	b.publish(t, all)
	b.assertVolumeExact(t, all)
}
