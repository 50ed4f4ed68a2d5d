package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Pausing a stream stops the fleet's Stripe calls for it: with events in
// flight, two consumers and a reaper running, `pelguard-consumer pause`
// leaves no ledger lease held and no charge made while paused, even after
// a consumer is SIGKILLed and more events arrive; the reaper does not take
// the paused consumers' entries. After `resume` (and a replacement for the
// killed consumer) every customer is charged exactly once: nothing lost,
// nothing billed twice.
func TestPauseStopsBillingAndLosesNothing(t *testing.T) {
	t.Parallel()
	w := newNSWorld(t, "pause")
	if err := w.sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 300 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	const first, later = 30, 10
	add := func(from, n int) {
		for i := from; i < from+n; i++ {
			w.add(t, event.Event{CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i), AmountCents: 500,
				BillingPeriod: "2026-11", Currency: "usd"}.Payload())
		}
	}
	add(0, first)
	consumerArgs := []string{"run", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms", "--workers", "3", "--lease", "3s"}
	c1 := startBin(t, "consumer", w.env, consumerArgs...)
	startBin(t, "consumer", w.env, consumerArgs...)
	startBin(t, "reaper", w.env, "run", "--stream", w.stream, "--metrics-addr", "", "--min-idle", "2s", "--interval", "200ms", "--lease", "3s")
	testenv.Eventually(t, 60*time.Second, func() bool { return w.sim.ChargeCreates() >= 4 }, "some charges made")

	r := runBin(t, "consumer", w.env, time.Minute, "pause", "--stream", w.stream, "--reason", "Stripe incident", "--by", "oncall")
	if r.code != 0 || !strings.Contains(r.out, "paused") {
		t.Fatalf("pause: exit %d\n%s", r.code, r.out)
	}
	leases := `SELECT count(*) FROM {schema}.billing_records WHERE lease_owner IS NOT NULL`
	testenv.Eventually(t, 30*time.Second, func() bool { return w.count(t, leases) == 0 }, "no lease held while paused")
	charged := w.sim.ChargeCreates()
	if charged >= first {
		t.Fatalf("every event (%d) was charged before the pause took effect: the test proves nothing", charged)
	}
	// A consumer dies while paused; more events arrive. Past the reaper's
	// --min-idle several times over, nothing is charged or claimed.
	_ = c1.cmd.Process.Kill()
	add(first, later)
	time.Sleep(5 * time.Second)
	if n := w.sim.ChargeCreates(); n != charged {
		t.Fatalf("%d charges made while paused (%d before)", n-charged, charged)
	}
	if n := w.count(t, leases); n != 0 {
		t.Fatalf("%d ledger leases held while paused", n)
	}
	st := runBin(t, "consumer", w.env, time.Minute, "paused")
	if st.code != 0 || !strings.Contains(st.out, w.stream) || !strings.Contains(st.out, "Stripe incident") {
		t.Fatalf("paused: exit %d\n%s", st.code, st.out)
	}

	r = runBin(t, "consumer", w.env, time.Minute, "resume", "--stream", w.stream, "--reason", "Stripe is back", "--by", "oncall")
	if r.code != 0 {
		t.Fatalf("resume: exit %d\n%s", r.code, r.out)
	}
	startBin(t, "consumer", w.env, consumerArgs...) // the killed one's replacement
	all := first + later
	testenv.Eventually(t, 120*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`) == all && w.pending(t) == 0
	}, "every event charged after the resume")
	for i := range all {
		if n := w.sim.SucceededCharges(fmt.Sprintf("c_%d", i), "2026-11"); n != 1 {
			t.Errorf("c_%d: %d charges, want 1", i, n)
		}
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.billing_records`); n != all {
		t.Errorf("%d ledger rows, want %d", n, all)
	}
	if n, _ := w.rdb.XLen(context.Background(), w.stream+":dead").Result(); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.stream_fact_changes WHERE fact IN ('pause', 'resume') AND actor = 'oncall'`); n != 2 {
		t.Errorf("%d recorded pause/resume changes, want 2", n)
	}
}

// The same on a meter-event stream: with meter events in flight (the
// emulator answers each after 2 s; one meter consumer has reserved a
// batch of 60 and calls 2 at a time), two meter consumers and a reaper
// running, `pause` stops the calls within seconds, the rest of the batch
// included, leaves no meter-ledger lease held and sends nothing while
// paused, even after a meter consumer is SIGKILLed and more events arrive. After `resume` (and a replacement for the killed one) each event
// is counted exactly once at the emulator and delivered once in the meter
// ledger, and every customer's total is what its events add up to.
func TestMeterPauseStopsUsageAndLosesNothing(t *testing.T) {
	t.Parallel()
	w := newNSWorld(t, "meterpause")
	// 2 s a call: at 500 ms, every event was once sent before the pause
	// took effect on a loaded CI machine (8 s into the test), and the
	// test proved nothing.
	if err := w.sim.SetFaults(stripesim.Faults{MeterEventLatency: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	const first, later = 60, 10
	now := time.Now().UTC().Truncate(time.Second)
	want := map[string]int64{}
	add := func(from, n int) {
		for i := from; i < from+n; i++ {
			cus := fmt.Sprintf("cus_m%d", i) // one event per customer: a batch reserves them all
			e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: cus, Value: int64(1 + i%4),
				Timestamp: now.Add(-time.Duration(i) * time.Second), EventID: fmt.Sprintf("req-%d", i)}
			want[cus] += e.Value
			w.add(t, e.Payload())
		}
	}
	add(0, first)
	meterArgs := []string{"meter-events", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms", "--workers", "2", "--pipeline", "1", "--lease", "3s"}
	c1 := startBin(t, "consumer", w.env, meterArgs...)
	startBin(t, "consumer", w.env, meterArgs...)
	startBin(t, "reaper", w.env, "run", "--meter-stream", w.stream, "--metrics-addr", "", "--min-idle", "2s", "--interval", "200ms", "--lease", "3s")
	testenv.Eventually(t, 60*time.Second, func() bool { return w.sim.MeterEventCounts().Recorded >= 4 }, "some meter events sent")

	r := runBin(t, "consumer", w.env, time.Minute, "pause", "--stream", w.stream, "--reason", "bad price rollout", "--by", "oncall")
	if r.code != 0 || !strings.Contains(r.out, "paused") {
		t.Fatalf("pause: exit %d\n%s", r.code, r.out)
	}
	// Every process reads the pauses each second; a call in flight takes
	// 2 s. Without the pause the batch's calls would go on for about a
	// minute.
	time.Sleep(2 * time.Second)
	leases := `SELECT count(*) FROM {schema}.meter_events WHERE lease_owner IS NOT NULL`
	testenv.Eventually(t, 5*time.Second, func() bool { return w.count(t, leases) == 0 }, "no meter lease held while paused")
	sent := w.sim.MeterEventCounts().Recorded
	if sent >= first {
		t.Fatalf("every meter event (%d) was sent before the pause took effect: the test proves nothing", sent)
	}
	t.Logf("%d of %d meter events sent before the pause took effect", sent, first)
	_ = c1.cmd.Process.Kill()
	add(first, later)
	time.Sleep(5 * time.Second)
	if n := w.sim.MeterEventCounts().Recorded; n != sent {
		t.Fatalf("%d meter events sent while paused (%d before)", n-sent, sent)
	}
	if n := w.count(t, leases); n != 0 {
		t.Fatalf("%d meter leases held while paused", n)
	}
	rows := w.count(t, `SELECT count(*) FROM {schema}.meter_events`)

	r = runBin(t, "consumer", w.env, time.Minute, "resume", "--stream", w.stream, "--reason", "price fixed", "--by", "oncall")
	if r.code != 0 {
		t.Fatalf("resume: exit %d\n%s", r.code, r.out)
	}
	startBin(t, "consumer", w.env, meterArgs...)
	all := first + later
	testenv.Eventually(t, 120*time.Second, func() bool {
		return w.count(t, `SELECT count(*) FROM {schema}.meter_events WHERE status = 'delivered'`) == all && w.pending(t) == 0
	}, "every meter event delivered after the resume")
	if rows >= all {
		t.Errorf("%d meter-ledger rows while paused: events added during the pause were started", rows)
	}
	c := w.sim.MeterEventCounts()
	if c.Recorded != int64(all) || c.Rejected != 0 || c.Invalid != 0 {
		t.Errorf("emulator: %+v, want %d recorded and nothing refused", c, all)
	}
	seen := map[string]int{}
	for _, e := range w.sim.MeterEvents("api_requests", "") {
		seen[e.Identifier]++
	}
	if len(seen) != all {
		t.Errorf("%d distinct identifiers at the emulator, want %d", len(seen), all)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s counted %d times", id, n)
		}
	}
	for cus, v := range want {
		if got := w.sim.MeterTotal("api_requests", cus); got != v {
			t.Errorf("%s: Stripe bills %d, events add up to %d", cus, got, v)
		}
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.meter_events`); n != all {
		t.Errorf("%d meter-ledger rows, want %d", n, all)
	}
	if n := w.count(t, `SELECT count(DISTINCT identifier) FROM {schema}.meter_events WHERE status = 'delivered'`); n != all {
		t.Errorf("%d distinct delivered identifiers, want %d", n, all)
	}
	if n, _ := w.rdb.XLen(context.Background(), w.stream+":dead").Result(); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}
