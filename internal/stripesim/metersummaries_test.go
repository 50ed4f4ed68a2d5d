package stripesim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

type window struct {
	start, end int64
	value      float64
}

func summaries(t *testing.T, sc *client.API, meterID, customer string, start, end time.Time, grouping string, limit int64) []window {
	t.Helper()
	p := &stripe.BillingMeterEventSummaryListParams{
		ID: stripe.String(meterID), Customer: stripe.String(customer),
		StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix()),
	}
	if grouping != "" {
		p.ValueGroupingWindow = stripe.String(grouping)
	}
	if limit > 0 {
		p.Limit = stripe.Int64(limit)
	}
	var out []window
	it := sc.BillingMeterEventSummaries.List(p)
	for it.Next() {
		s := it.BillingMeterEventSummary()
		if s.Meter != meterID {
			t.Fatalf("summary of meter %s, want %s", s.Meter, meterID)
		}
		out = append(out, window{s.StartTime, s.EndTime, s.AggregatedValue})
	}
	if err := it.Err(); err != nil {
		t.Fatalf("listing summaries: %v", err)
	}
	return out
}

func sendAt(t *testing.T, sc *client.API, eventName, customer, value, identifier string, ts time.Time) {
	t.Helper()
	if _, err := sc.BillingMeterEvents.New(eventParams(eventName, customer, value, identifier, ts.Unix())); err != nil {
		t.Fatalf("sending %s: %v", identifier, err)
	}
}

func TestMeterEventSummaries(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 5, 3, 12, 0, 0, 0, time.UTC)
	_, sc := setup(t, Config{Now: now})
	sum := newMeter(t, sc, "api_calls", FormulaSum)
	count := newMeter(t, sc, "logins", FormulaCount)
	last := newMeter(t, sc, "seats", FormulaLast)
	day1, day2 := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 5, 2, 0, 0, 0, 0, time.UTC)
	at := []time.Time{day1.Add(10 * time.Minute), day1.Add(50 * time.Minute), day1.Add(3*time.Hour + time.Second), day2.Add(23*time.Hour + 59*time.Minute)}
	for i, ts := range at {
		id := string(rune('a' + i))
		sendAt(t, sc, "api_calls", "cus_a", []string{"3", "4", "10", "100"}[i], "s-"+id, ts)
		sendAt(t, sc, "logins", "cus_a", "9", "c-"+id, ts)
		sendAt(t, sc, "seats", "cus_a", []string{"5", "2", "8", "6"}[i], "l-"+id, ts)
	}
	sendAt(t, sc, "api_calls", "cus_b", "1000", "other-customer", at[0])
	end := day2.Add(24 * time.Hour)

	h := time.Hour
	hourly := summaries(t, sc, sum.ID, "cus_a", day1, end, "hour", 2) // pages of 2
	want := []window{
		{day2.Add(23 * h).Unix(), end.Unix(), 100},
		{day1.Add(3 * h).Unix(), day1.Add(4 * h).Unix(), 10},
		{day1.Unix(), day1.Add(h).Unix(), 7},
	}
	if !equalWindows(hourly, want) {
		t.Fatalf("hourly = %v, want %v (newest first, empty hours left out)", hourly, want)
	}
	daily := summaries(t, sc, sum.ID, "cus_a", day1, end, "day", 0)
	if want := []window{{day2.Unix(), end.Unix(), 100}, {day1.Unix(), day2.Unix(), 17}}; !equalWindows(daily, want) {
		t.Fatalf("daily = %v, want %v", daily, want)
	}
	whole := summaries(t, sc, sum.ID, "cus_a", day1.Add(30*time.Minute), end, "", 0)
	if want := []window{{day1.Add(30 * time.Minute).Unix(), end.Unix(), 114}}; !equalWindows(whole, want) {
		t.Fatalf("whole range = %v, want %v", whole, want)
	}
	if got := summaries(t, sc, count.ID, "cus_a", day1, end, "day", 0); !equalWindows(got, []window{{day2.Unix(), end.Unix(), 1}, {day1.Unix(), day2.Unix(), 3}}) {
		t.Fatalf("count meter daily = %v", got)
	}
	if got := summaries(t, sc, last.ID, "cus_a", day1, end, "day", 0); !equalWindows(got, []window{{day2.Unix(), end.Unix(), 6}, {day1.Unix(), day2.Unix(), 8}}) {
		t.Fatalf("last meter daily = %v", got)
	}
	if got := summaries(t, sc, sum.ID, "cus_nobody", day1, end, "", 0); !equalWindows(got, []window{{day1.Unix(), end.Unix(), 0}}) {
		t.Fatalf("a customer without events = %v, want one zero summary", got)
	}

	// A cancelled event leaves the summaries.
	if _, err := sc.BillingMeterEventAdjustments.New(&stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String("api_calls"), Type: stripe.String("cancel"),
		Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("s-c")},
	}); err != nil {
		t.Fatal(err)
	}
	daily = summaries(t, sc, sum.ID, "cus_a", day1, end, "day", 0)
	if want := []window{{day2.Unix(), end.Unix(), 100}, {day1.Unix(), day2.Unix(), 7}}; !equalWindows(daily, want) {
		t.Fatalf("daily after cancelling s-c = %v, want %v", daily, want)
	}

	for name, p := range map[string]*stripe.BillingMeterEventSummaryListParams{
		"unaligned minute": {StartTime: stripe.Int64(day1.Unix() + 30), EndTime: stripe.Int64(end.Unix())},
		"unaligned hour":   {StartTime: stripe.Int64(day1.Add(time.Minute).Unix()), EndTime: stripe.Int64(end.Unix()), ValueGroupingWindow: stripe.String("hour")},
		"unaligned day":    {StartTime: stripe.Int64(day1.Add(time.Hour).Unix()), EndTime: stripe.Int64(end.Unix()), ValueGroupingWindow: stripe.String("day")},
		"unknown window":   {StartTime: stripe.Int64(day1.Unix()), EndTime: stripe.Int64(end.Unix()), ValueGroupingWindow: stripe.String("week")},
		"end before start": {StartTime: stripe.Int64(end.Unix()), EndTime: stripe.Int64(day1.Unix())},
		"no start":         {EndTime: stripe.Int64(end.Unix())},
	} {
		p.ID, p.Customer = stripe.String(sum.ID), stripe.String("cus_a")
		it := sc.BillingMeterEventSummaries.List(p)
		for it.Next() {
		}
		if err := it.Err(); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			stripeErr(t, err, http.StatusBadRequest)
		}
	}
}

func equalWindows(a, b []window) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func cancelParams(eventName, identifier string) *stripe.BillingMeterEventAdjustmentParams {
	return &stripe.BillingMeterEventAdjustmentParams{
		EventName: stripe.String(eventName), Type: stripe.String("cancel"),
		Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String(identifier)},
	}
}

// An event can be cancelled only within 24 hours of Stripe receiving it;
// a cancelled event stops counting but keeps its identifier taken.
func TestMeterEventAdjustments(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	sendAt(t, sc, "api_calls", "cus_a", "5", "a-1", srv.Now())
	sendAt(t, sc, "api_calls", "cus_a", "7", "a-2", srv.Now())
	srv.Advance(MeterCancelWindow - time.Second)
	adj, err := sc.BillingMeterEventAdjustments.New(cancelParams("api_calls", "a-1"))
	if err != nil || adj.Cancel.Identifier != "a-1" || adj.Type != "cancel" || adj.Object != "billing.meter_event_adjustment" {
		t.Fatalf("cancel = %+v, %v", adj, err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 7 {
		t.Fatalf("total %d after cancelling a-1, want 7", got)
	}
	if _, err := sc.BillingMeterEventAdjustments.New(cancelParams("api_calls", "a-1")); err != nil {
		t.Fatalf("cancelling twice: %v", err)
	}
	_, err = sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "5", "a-1", 0))
	stripeErr(t, err, http.StatusBadRequest) // its identifier is still taken

	srv.Advance(time.Second) // a-2 was received 24 h ago
	_, err = sc.BillingMeterEventAdjustments.New(cancelParams("api_calls", "a-2"))
	stripeErr(t, err, http.StatusBadRequest)
	_, err = sc.BillingMeterEventAdjustments.New(cancelParams("api_calls", "never-sent"))
	stripeErr(t, err, http.StatusBadRequest)
	_, err = sc.BillingMeterEventAdjustments.New(cancelParams("other_meter", "a-2"))
	stripeErr(t, err, http.StatusBadRequest)
	_, err = sc.BillingMeterEventAdjustments.New(&stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String("api_calls"),
		Cancel: &stripe.BillingMeterEventAdjustmentCancelParams{Identifier: stripe.String("a-2")}})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Param != "type" {
		t.Fatalf("no type: %+v", se)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 7 {
		t.Fatalf("total %d, want 7", got)
	}
	evs := srv.MeterEvents("api_calls", "cus_a")
	if len(evs) != 2 || !evs[0].Cancelled || evs[1].Cancelled || evs[0].Identifier != "a-1" {
		t.Fatalf("events %+v", evs)
	}
	if c := srv.MeterEventCounts(); c.Cancelled != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// The faults pelguard must survive: a response lost after the event was
// recorded, and an event Stripe answers 200 and then rejects.
func TestMeterEventFaults(t *testing.T) {
	t.Parallel()
	t.Run("recorded, response lost", func(t *testing.T) {
		t.Parallel()
		srv, sc := setup(t, Config{Faults: Faults{DropNextMeterEvents: 1}})
		newMeter(t, sc, "api_calls", FormulaSum)
		sc = newClient(t, srv, clientOpts{httpClient: noKeepAlive()})
		p := eventParams("api_calls", "cus_a", "5", "d-1", 0)
		p.SetIdempotencyKey("meter-d-1")
		_, err := sc.BillingMeterEvents.New(p)
		var se *stripe.Error
		if err == nil || errors.As(err, &se) {
			t.Fatalf("want a transport error, got %v", err)
		}
		if got := srv.MeterTotal("api_calls", "cus_a"); got != 5 || srv.Faults().DropNextMeterEvents != 0 {
			t.Fatalf("total %d after the dropped response, want 5 (recorded)", got)
		}
		// The retry under the same key replays the 200; under a new key
		// it meets the identifier.
		p = eventParams("api_calls", "cus_a", "5", "d-1", 0)
		p.SetIdempotencyKey("meter-d-1")
		ev, err := sc.BillingMeterEvents.New(p)
		if err != nil || ev.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry with the same key: %v", err)
		}
		_, err = sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "5", "d-1", 0))
		stripeErr(t, err, http.StatusBadRequest)
		if got := srv.MeterTotal("api_calls", "cus_a"); got != 5 {
			t.Fatalf("total %d, want 5", got)
		}
	})
	t.Run("rejected after its 200", func(t *testing.T) {
		t.Parallel()
		srv, sc := setup(t, Config{Faults: Faults{RejectNextMeterEvents: 1}, RequireCustomers: true})
		newMeter(t, sc, "api_calls", FormulaSum)
		cus := srv.CreateCustomer(CustomerSeed{})
		sendAt(t, sc, "api_calls", cus.ID, "5", "j-1", srv.Now())        // injected rejection
		sendAt(t, sc, "api_calls", "cus_unknown", "5", "j-2", srv.Now()) // no such customer
		sendAt(t, sc, "api_calls", cus.ID, "3", "j-3", srv.Now())        // counted
		if got := srv.MeterTotal("api_calls", cus.ID); got != 3 {
			t.Fatalf("total %d, want 3: only j-3 counts", got)
		}
		reports := srv.MeterErrorReports()
		if len(reports) != 2 || reports[0].Code != "stripesim_injected" || reports[0].Identifier != "j-1" ||
			reports[1].Code != "meter_event_customer_not_found" || reports[1].Customer != "cus_unknown" {
			t.Fatalf("error reports %+v", reports)
		}
		if c := srv.MeterEventCounts(); c.Rejected != 2 || c.Recorded != 1 {
			t.Fatalf("counts %+v", c)
		}
	})
}

func TestMeterAdminEndpoints(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	sendAt(t, sc, "api_calls", "cus_a", "4", "x-1", srv.Now())
	sendAt(t, sc, "api_calls", "cus_a", "6", "x-2", srv.Now())
	resp, err := http.Get(srv.URL() + "/_sim/meter_events?event_name=api_calls&customer=cus_a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var got struct {
		Events []MeterEvent `json:"events"`
		Total  int64        `json:"total"`
	}
	if err := json.Unmarshal(body, &got); err != nil || len(got.Events) != 2 || got.Total != 10 {
		t.Fatalf("GET /_sim/meter_events = %s (%v)", body, err)
	}
	resp, err = http.Get(srv.URL() + "/_sim/meters")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var meters struct {
		Meters []BillingMeter   `json:"meters"`
		Counts MeterEventCounts `json:"counts"`
	}
	if err := json.Unmarshal(body, &meters); err != nil || len(meters.Meters) != 1 || meters.Counts.Recorded != 2 {
		t.Fatalf("GET /_sim/meters = %s (%v)", body, err)
	}
}
