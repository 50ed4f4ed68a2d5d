package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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

// runMeterChild is a meter consumer process (PELGUARD_CHILD=meter-consumer)
// that runs until the test kills it.
func runMeterChild() int {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("CHILD_REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	pool, err := pg.Open(ctx, os.Getenv("CHILD_DATABASE_URL"), 4)
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
		Name: os.Getenv("CHILD_NAME"), Namespace: "test", Count: 20, Workers: 8, Lease: 2 * time.Second, Block: 50 * time.Millisecond})
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

// A fleet of three meter consumer processes and a reaper, the consumers
// SIGKILLed at random moments (inside calls, between Stripe's reply and the
// ledger write, before XACK) and replaced: Stripe counts every event
// exactly once, and never has two calls of one customer's meter in flight.
// One customer has a meter cap: Stripe counts exactly what fits under it
// each month, the rest is dead-lettered spend_cap, never sent.
func TestMeterFleetUnderSIGKILLsCountsEachEventOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 15 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var evs []event.MeterEvent
	for i := range 400 {
		evs = append(evs, meterEvent(i%25, i, now.Add(-time.Duration(i)*time.Second)))
	}
	b.addMeter(t, evs...)
	l, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool)})
	if err != nil {
		t.Fatal(err)
	}
	// cus_1's 16 events are of 2 units each: 10 fit under 20 a month.
	const capped, capUnits = "cus_1", 20
	if _, err := l.SetCap(context.Background(), meterledger.Cap{EventName: meterName, StripeCustomerID: capped,
		Month: meterledger.AnyMonth, Cap: capUnits}); err != nil {
		t.Fatal(err)
	}
	want := sums(evs)
	perMonth := map[time.Time]int64{}
	for _, e := range evs {
		if e.StripeCustomerID == capped {
			if e.Value != 2 {
				t.Fatalf("%s's events are meant to be of 2 units", capped)
			}
			perMonth[meterledger.MonthOf(e.Timestamp)] += e.Value
		}
	}
	want[capped] = 0
	for _, units := range perMonth {
		want[capped] += min(units, capUnits)
	}
	refused := int((sums(evs)[capped] - want[capped]) / 2)

	start := func(name string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PELGUARD_CHILD=meter-consumer", "CHILD_NAME="+name,
			"CHILD_REDIS_URL="+testenv.RedisURL(), "CHILD_DATABASE_URL="+b.dbURL, "CHILD_DB_SCHEMA="+testenv.SchemaOfURL(b.dbURL),
			"CHILD_STRIPE_URL="+b.sim.URL(), "CHILD_STREAM="+b.stream, "CHILD_GROUP="+b.group)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	fleet := []*exec.Cmd{start("m-0"), start("m-1"), start("m-2")}
	defer func() {
		for _, c := range fleet {
			kill(c)
		}
	}()
	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		MeterStreams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, MeterStripe: b.stripe,
		Name: "reaper-kill", MinIdle: 500 * time.Millisecond, Interval: 100 * time.Millisecond,
		Namespace: "test", Lease: 2 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()

	// Twelve kills, each replaced by a process of a new name (the dead
	// one's entries are the reaper's to recover).
	rng := rand.New(rand.NewPCG(7, 28))
	for k := range 12 {
		time.Sleep(time.Duration(100+rng.IntN(250)) * time.Millisecond)
		i := rng.IntN(len(fleet))
		kill(fleet[i])
		fleet[i] = start(fmt.Sprintf("m-%d-%d", i, k))
	}
	sent := int64(len(evs) - refused)
	testenv.Eventually(t, 90*time.Second, func() bool {
		return b.pending(t) == 0 && b.sim.MeterEventCounts().Recorded >= sent
	}, "the fleet did not drain: %+v recorded, %d pending", b.sim.MeterEventCounts(), b.pending(t))
	b.assertMeterTotals(t, want)
	c := b.sim.MeterEventCounts()
	if c.Recorded != sent {
		t.Fatalf("Stripe recorded %d events; want %d of %d (%d over the cap)", c.Recorded, sent, len(evs), refused)
	}
	if c.Concurrent != 0 {
		t.Fatalf("%d calls refused because another call of the customer's meter was in flight", c.Concurrent)
	}
	counts, err := l.Counts(context.Background(), now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil || counts[meterledger.StatusDelivered] != sent || len(counts) != 1 {
		t.Fatalf("ledger %v (%v): want %d delivered and nothing else", counts, err, sent)
	}
	dl, err := b.rdb.XRange(context.Background(), consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != refused {
		t.Fatalf("%d dead letters (%v): want the %d over the cap", len(dl), err, refused)
	}
	for _, d := range dl {
		if d.Values["reason"] != consumer.ReasonSpendCap {
			t.Fatalf("dead letter %v: only spend_cap expected within the window", d.Values)
		}
	}
	for m, units := range perMonth {
		us, err := l.Usage(context.Background(), meterName, capped, m)
		if err != nil || len(us) != 1 || us[0].Units != min(units, capUnits) {
			t.Fatalf("the ledger's use of %s in %s: %+v %v; want %d", capped, m.Format("2006-01"), us, err, min(units, capUnits))
		}
	}
}
