package chaos

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBusyCustomerDrill runs usage-busy-customer small: one customer at
// 200 events/s for 5 s beside 10 quiet ones at 1/s, Stripe answering in
// 100 ms, 20 s allowed after sending ends. Three naive senders making one
// 100 ms call at a time cannot send 1,050 events in 25 s even without a
// refusal, so the naive side cannot catch up; pelguard must have every
// event counted exactly once (per customer) within the bound, in far fewer
// calls than events, with nothing left on its stream.
func TestBusyCustomerDrill(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, 1)
	cfg.Scenarios = []string{ScenarioUsageBusyCustomer}
	cfg.Busy = BusyConfig{Rate: 200, For: 5 * time.Second, Quiet: 10, QuietRate: 1, Latency: 100 * time.Millisecond,
		After: 5 * time.Second, Bound: 20 * time.Second}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	if len(rep.Busy) != 2 || len(rep.Results) != 0 || len(rep.Usage) != 0 {
		t.Fatalf("%d busy rows, %d charge rows, %d usage rows: want 2, 0, 0", len(rep.Busy), len(rep.Results), len(rep.Usage))
	}
	sides := map[string]BusyResult{}
	for _, x := range rep.Busy {
		if x.Failed() {
			t.Fatalf("%s/%s: %s", x.Scenario, x.Mode, x.Error)
		}
		sides[x.Mode] = x
		// 200/s for 5 s, 10 quiet customers at 1/s.
		if x.BusyProduced != 1000 || x.Produced != 1050 || x.QuietCustomers != 10 {
			t.Errorf("%s: produced %d (busy %d) for %d quiet customers, want 1050 (1000) and 10", x.Mode, x.Produced, x.BusyProduced, x.QuietCustomers)
		}
		if x.OverCounted != 0 {
			t.Errorf("%s: Stripe counts %d events twice", x.Mode, x.OverCounted)
		}
		if len(x.Series) < 5 {
			t.Errorf("%s: %d points in the series", x.Mode, len(x.Series))
		}
	}
	n, p := sides[ModeNaiveIdentifier], sides[ModePelguard]
	if n.CaughtUp() || n.Counted >= int64(n.Produced) || n.Backlog == 0 || n.QuietShortAtEnd == 0 || n.BusyAtEnd >= int64(n.BusyProduced) {
		t.Errorf("naive: caught up after %gs, %d of %d counted, %d unacknowledged, %d quiet short when sending ended, busy %d of %d: "+
			"one call per event at 100 ms cannot keep up", n.CaughtUpSeconds, n.Counted, n.Produced, n.Backlog, n.QuietShortAtEnd, n.BusyAtEnd, n.BusyProduced)
	}
	if !p.CaughtUp() || p.Counted != int64(p.Produced) || p.QuietShortAtStop != 0 || p.Backlog != 0 || p.BusyAfter != int64(p.BusyProduced) {
		t.Errorf("pelguard: caught up after %gs, %d of %d counted, %d quiet short, %d unacknowledged, busy %d of %d after %gs: want every event counted within %gs",
			p.CaughtUpSeconds, p.Counted, p.Produced, p.QuietShortAtStop, p.Backlog, p.BusyAfter, p.BusyProduced, p.AfterSeconds, p.BoundSeconds)
	}
	// One call per customer and second (a few more: a second split across
	// rounds, a re-send under the same identifier), never one per event.
	if p.StripeCalls == 0 || 2*p.StripeCalls > int64(p.Produced) || p.BusyCalls == 0 || 10*p.BusyCalls > p.BusyProduced {
		t.Errorf("pelguard made %d Stripe calls for %d events, %d for the busy customer's %d", p.StripeCalls, p.Produced, p.BusyCalls, p.BusyProduced)
	}
	if f := rep.Failures(); len(f) > 0 {
		t.Errorf("failures: %v", f)
	}
}

func sampleBusyReport() Report {
	series := []BusyPoint{{Seconds: 1, Produced: 250, BusyProduced: 200, Counted: 20, BusyCounted: 15}, {Seconds: 2, Produced: 500, BusyProduced: 400, Counted: 40, BusyCounted: 30}}
	return Report{Busy: []BusyResult{
		{Scenario: ScenarioUsageBusyCustomer, Mode: ModeNaiveIdentifier, ProductionSeconds: 20, BusyRate: 200, QuietRate: 1, LatencyMS: 100,
			Produced: 5000, BusyProduced: 4000, Counted: 647, BusyAtEnd: 310, BusyAfter: 420, AfterSeconds: 10, QuietCustomers: 50,
			QuietShortAtEnd: 50, QuietMissingAtEnd: 120, QuietShortAtStop: 50, CaughtUpSeconds: -1, BoundSeconds: 30, StripeCalls: 1679, Refused: 1032, Backlog: 4353, Series: series},
		{Scenario: ScenarioUsageBusyCustomer, Mode: ModePelguard, ProductionSeconds: 20, BusyRate: 200, QuietRate: 1, LatencyMS: 100,
			Produced: 5000, BusyProduced: 4000, Counted: 5000, BusyAtEnd: 3800, BusyAfter: 4000, AfterSeconds: 10, QuietCustomers: 50,
			QuietShortAtEnd: 3, CaughtUpSeconds: 4.5, BoundSeconds: 30, StripeCalls: 1019, BusyCalls: 19, Series: series},
	}}
}

func TestBusyOutput(t *testing.T) {
	t.Parallel()
	rep := sampleBusyReport()
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	txt := table.String()
	for _, s := range []string{"volume scenario", "counted when sending ended", "not within 30s", "after 4.5s", "1679 (1032)",
		"1.0s of its usage behind", "50 of the 50 quiet customers were short (120 of their events not counted yet, 2.4s of their usage)", "50 of 50 (120)", "an invoice closed then under-bills", "each exactly once", "the busy customer's 4000 events in 19", "Stripe refused 1032 of the 1679 calls"} {
		if !strings.Contains(txt, s) {
			t.Errorf("table lacks %q:\n%s", s, txt)
		}
	}
	if strings.Contains(txt, "dollars double-charged") {
		t.Errorf("a busy-only run shows the charge table:\n%s", txt)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var out map[string][]map[string]any
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	want := []string{"backlog_at_stop", "bound_seconds", "busy_counted_after", "busy_counted_at_end", "busy_produced", "busy_rate",
		"caught_up_seconds", "counted", "after_seconds", "mode", "overcounted", "produced", "production_seconds", "quiet_customers",
		"quiet_missing_at_end", "quiet_rate", "busy_calls", "quiet_short_at_end", "quiet_short_at_stop", "refused_calls", "scenario", "stripe_calls", "stripe_latency_ms"}
	slices.Sort(want)
	if len(out["busy_customer"]) != 2 {
		t.Fatalf("JSON %s", buf.String())
	}
	for _, r := range out["busy_customer"] {
		var got []string
		for k := range r {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("busy fields %v, want %v", got, want)
		}
	}
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	h := page.String()
	for _, s := range []string{"Usage at volume: one busy customer", "<polyline class=\"c-pelguard\"", "sending ends", "beside 50 quiet customers",
		"answers each meter-event call in 100 ms", "not within 30s", "Verdicts hold", "naive senders fell behind"} {
		if !strings.Contains(h, s) {
			t.Errorf("HTML lacks %q", s)
		}
	}
	if f := rep.Failures(); len(f) != 0 {
		t.Errorf("failures %v", f)
	}
}

func TestBusyFailuresSayWhy(t *testing.T) {
	t.Parallel()
	rep := Report{Busy: []BusyResult{
		{Scenario: ScenarioUsageBusyCustomer, Mode: ModeNaiveIdentifier, Produced: 100, Counted: 100, CaughtUpSeconds: 3, BoundSeconds: 30},
		{Scenario: ScenarioUsageBusyCustomer, Mode: ModePelguard, Produced: 100, Counted: 90, OverCounted: 2, CaughtUpSeconds: -1, BoundSeconds: 30},
	}}
	got := strings.Join(rep.Failures(), "\n")
	for _, s := range []string{"naive senders caught up within 30s, so the drill did not reproduce the backlog",
		"pelguard had 90 of 100 events counted 30s after production", "Stripe counts 2 event(s) more than were sent"} {
		if !strings.Contains(got, s) {
			t.Errorf("failures lack %q:\n%s", s, got)
		}
	}
	rep.Busy[1].Error = "the scenario did not finish"
	if !rep.Incomplete() || !strings.Contains(strings.Join(rep.Failures(), "\n"), "usage-busy-customer/pelguard: FAILED") {
		t.Errorf("a failed side must make the run incomplete: %v", rep.Failures())
	}
}
