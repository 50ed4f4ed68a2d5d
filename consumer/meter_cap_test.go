package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A meter spend cap, end to end: two consumers share the stream; one
// customer has a cap of 20 units for the month, the others none. Stripe
// counts the capped customer's events up to the cap and never past it, the
// rest are dead-lettered with spend_cap and one alert (deduplicated by
// meter, customer and month); the other customers are counted in full.
// Once the cap is raised, the operator's replay sends the refused events,
// each counted once.
func TestMeterCapStopsACustomerAtItsCap(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := meterWorld(t, now)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ledger, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const capUnits = 20
	if _, err := ledger.SetCap(ctx, meterledger.Cap{EventName: meterName, StripeCustomerID: "cus_0", Month: meterledger.AnyMonth, Cap: capUnits}); err != nil {
		t.Fatal(err)
	}
	// 60 events, 20 per customer, values 1..5; all of this month.
	var evs []event.MeterEvent
	at := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Add(time.Hour)
	if now.Sub(at) < 2*time.Hour {
		at = now.Add(-time.Minute) // the first hour of a month: no older events this month
	}
	for i := range 60 {
		evs = append(evs, meterEvent(i%3, i, at.Add(time.Duration(i)*time.Millisecond)))
	}
	b.addMeter(t, evs...)
	mem := alerts.NewMemory()
	m := consumer.NewMetrics(prometheus.NewRegistry())
	// run runs two consumers until every entry has been sent or
	// dead-lettered: want in all.
	run := func(t *testing.T, want int64) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, name := range []string{"m-a", "m-b"} {
			c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
				Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: name, Namespace: "test", Block: 20 * time.Millisecond,
				Notifier: mem, Metrics: m, Logger: testenv.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); _ = c.Run(rctx) }()
		}
		done := func() int64 {
			n, err := b.rdb.XLen(ctx, consumer.DeadLetterStream(b.stream)).Result()
			if err != nil {
				t.Fatal(err)
			}
			return b.sim.MeterEventCounts().Recorded + n
		}
		testenv.Eventually(t, 60*time.Second, func() bool { return done() >= want && b.pending(t) == 0 },
			"%d of %d entries sent or dead-lettered, %d pending", done(), want, b.pending(t))
		cancel()
		wg.Wait()
	}
	run(t, int64(len(evs)))

	got0 := b.sim.MeterTotal(meterName, "cus_0")
	if got0 > capUnits || got0 < capUnits-4 {
		t.Fatalf("cus_0: Stripe counts %d; want at most the cap %d, and no less than the cap less one event's value", got0, capUnits)
	}
	others := sums(evs)
	want0 := others["cus_0"]
	delete(others, "cus_0")
	b.assertMeterTotals(t, others)
	dl, err := b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var deadUnits int64
	for _, d := range dl {
		if d.Values["reason"] != consumer.ReasonSpendCap || !strings.Contains(fmt.Sprint(d.Values["detail"]), "cap of 20 units for cus_0") {
			t.Fatalf("dead letter %v: want reason spend_cap naming the cap", d.Values)
		}
		ev, err := event.ParseMeterFields(d.Values, event.MeterRules{}, now)
		if err != nil {
			t.Fatal(err)
		}
		deadUnits += ev.Value
	}
	if got0+deadUnits != want0 {
		t.Fatalf("cus_0: %d counted + %d dead-lettered != %d sent to the stream", got0, deadUnits, want0)
	}
	var capAlerts int
	for _, a := range mem.Alerts() {
		if a.Kind == alerts.KindSpendCap {
			capAlerts++
		}
	}
	if capAlerts == 0 || consumer.EventsCounted(m, b.stream, consumer.OutcomeSpendCap) != float64(len(dl)) {
		t.Fatalf("%d cap alerts, %v spend_cap outcomes; want alerts and %d outcomes", capAlerts,
			consumer.EventsCounted(m, b.stream, consumer.OutcomeSpendCap), len(dl))
	}
	us, err := ledger.Usage(ctx, meterName, "cus_0", at)
	if err != nil || len(us) != 1 || us[0].Units != got0 {
		t.Fatalf("the ledger's use of cus_0: %+v %v; want %d, what Stripe counts", us, err, got0)
	}

	// Raised; replayed: every refused event is counted once.
	if _, err := ledger.SetCap(ctx, meterledger.Cap{EventName: meterName, StripeCustomerID: "cus_0", Month: meterledger.AnyMonth, Cap: 1000}); err != nil {
		t.Fatal(err)
	}
	replayed, err := consumer.ReplayDeadLetters(ctx, b.rdb, b.stream, consumer.ReasonSpendCap, 0, false)
	if err != nil || len(replayed) != len(dl) {
		t.Fatalf("replayed %d of %d: %v", len(replayed), len(dl), err)
	}
	// The replayed events' dead letters were removed; Stripe's count
	// reaches every event.
	run(t, int64(len(evs)))
	b.assertMeterTotals(t, sums(evs))
	if c := b.sim.MeterEventCounts(); c.Recorded != 60 || c.Concurrent != 0 {
		t.Fatalf("emulator %+v: want 60 recorded, none while another of the customer's was in flight", c)
	}
}
