package stripesim

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// newMeter creates a meter over HTTP, as a team does in its Dashboard or
// with the API.
func newMeter(t *testing.T, sc *client.API, eventName, formula string) *stripe.BillingMeter {
	t.Helper()
	m, err := sc.BillingMeters.New(&stripe.BillingMeterParams{
		DisplayName:        stripe.String("API calls"),
		EventName:          stripe.String(eventName),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String(formula)},
		CustomerMapping: &stripe.BillingMeterCustomerMappingParams{
			Type: stripe.String("by_id"), EventPayloadKey: stripe.String("stripe_customer_id"),
		},
		ValueSettings: &stripe.BillingMeterValueSettingsParams{EventPayloadKey: stripe.String("value")},
	})
	if err != nil {
		t.Fatalf("creating meter %s: %v", eventName, err)
	}
	return m
}

// eventParams is a meter event's params; ts 0 leaves the timestamp out.
func eventParams(eventName, customer, value, identifier string, ts int64) *stripe.BillingMeterEventParams {
	p := &stripe.BillingMeterEventParams{
		EventName: stripe.String(eventName),
		Payload:   map[string]string{"stripe_customer_id": customer, "value": value},
	}
	if identifier != "" {
		p.Identifier = stripe.String(identifier)
	}
	if ts != 0 {
		p.Timestamp = stripe.Int64(ts)
	}
	return p
}

func TestMetersCreateListGet(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	m := newMeter(t, sc, "api_calls", FormulaSum)
	if m.ID == "" || m.EventName != "api_calls" || m.DefaultAggregation.Formula != "sum" || m.Status != stripe.BillingMeterStatusActive ||
		m.CustomerMapping.EventPayloadKey != "stripe_customer_id" || m.ValueSettings.EventPayloadKey != "value" || m.Created != t0.Unix() {
		t.Fatalf("meter %+v", m)
	}
	got, err := sc.BillingMeters.Get(m.ID, nil)
	if err != nil || got.ID != m.ID || got.DisplayName != "API calls" {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if _, err := sc.BillingMeters.Get("mtr_missing", nil); err == nil {
		t.Fatal("get of an unknown meter succeeded")
	} else {
		stripeErr(t, err, http.StatusNotFound)
	}
	second, err := srv.CreateBillingMeter(BillingMeterSeed{EventName: "tokens", Formula: FormulaLast})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	it := sc.BillingMeters.List(&stripe.BillingMeterListParams{ListParams: stripe.ListParams{Limit: stripe.Int64(1)}})
	for it.Next() {
		listed = append(listed, it.BillingMeter().ID)
	}
	if it.Err() != nil || len(listed) != 2 || listed[0] != second.ID || listed[1] != m.ID {
		t.Fatalf("list (pages of 1) = %v, %v; want newest first [%s %s]", listed, it.Err(), second.ID, m.ID)
	}

	// Documented: an event name belongs to one meter.
	_, err = sc.BillingMeters.New(&stripe.BillingMeterParams{DisplayName: stripe.String("again"), EventName: stripe.String("api_calls"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")}})
	stripeErr(t, err, http.StatusBadRequest)
	_, err = sc.BillingMeters.New(&stripe.BillingMeterParams{DisplayName: stripe.String("x"), EventName: stripe.String("x"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("max")}})
	stripeErr(t, err, http.StatusBadRequest)
	// Pre-aggregated meters are refused, not silently mis-modelled.
	_, err = sc.BillingMeters.New(&stripe.BillingMeterParams{DisplayName: stripe.String("h"), EventName: stripe.String("hourly"),
		EventTimeWindow:    stripe.String("hour"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")}})
	if se := stripeErr(t, err, http.StatusBadRequest); !strings.Contains(se.Msg, "event_time_window") {
		t.Fatalf("refusal %q does not name event_time_window", se.Msg)
	}
	if n := len(srv.BillingMeters()); n != 2 {
		t.Fatalf("%d meters stored, want 2", n)
	}
}

// A repeated identifier is refused for 24 hours of the emulator's clock
// and accepted, and counted again, after: the window pelguard must
// outlive with its ledger.
func TestMeterEventIdentifierWindow(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	ev, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "5", "evt-1", 0))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Identifier != "evt-1" || ev.Timestamp != t0.Unix() || ev.Payload["value"] != "5" || ev.Object != "billing.meter_event" {
		t.Fatalf("event %+v", ev)
	}
	refused := func(when string) {
		t.Helper()
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "5", "evt-1", 0))
		se := stripeErr(t, err, http.StatusBadRequest)
		if se.Type != stripe.ErrorTypeInvalidRequest || se.Msg != "An event already exists with identifier evt-1." {
			t.Fatalf("%s: refusal %s %q", when, se.Type, se.Msg)
		}
	}
	refused("at once")
	srv.Advance(MeterIdentifierWindow - time.Second)
	refused("a second before the window ends")
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 5 {
		t.Fatalf("total %d inside the window, want 5", got)
	}
	srv.Advance(time.Second)
	if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "5", "evt-1", 0)); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 10 {
		t.Fatalf("total %d after the window, want 10: the identifier no longer protects", got)
	}
	// Without an identifier Stripe makes one up: every call counts.
	for range 2 {
		ev, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_b", "1", "", 0))
		if err != nil || ev.Identifier == "" {
			t.Fatalf("no identifier: %+v, %v", ev, err)
		}
	}
	if got := srv.MeterTotal("api_calls", "cus_b"); got != 2 {
		t.Fatalf("total %d without identifiers, want 2", got)
	}
	c := srv.MeterEventCounts()
	if c.Recorded != 4 || c.Duplicates != 2 {
		t.Fatalf("counts %+v", c)
	}
	// Same identifier under another meter: refused too (identifiers are
	// the account's, the strictest reading).
	newMeter(t, sc, "tokens", FormulaSum)
	_, err = sc.BillingMeterEvents.New(eventParams("tokens", "cus_a", "1", "evt-1", 0))
	stripeErr(t, err, http.StatusBadRequest)
}

func TestMeterEventTimestampBounds(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	now := srv.Now().Unix()
	oldest, latest := now-int64(MeterEventMaxAge/time.Second), now+int64(MeterEventMaxFuture/time.Second)
	for i, tc := range []struct {
		ts int64
		ok bool
	}{{oldest, true}, {oldest - 1, false}, {latest, true}, {latest + 1, false}, {now, true}} {
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "ts-"+strconv.Itoa(i), tc.ts))
		if tc.ok && err != nil {
			t.Errorf("timestamp now%+ds refused: %v", tc.ts-now, err)
		}
		if !tc.ok {
			if se := stripeErr(t, err, http.StatusBadRequest); se.Param != "timestamp" {
				t.Errorf("timestamp now%+ds: param %q", tc.ts-now, se.Param)
			}
		}
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 3 {
		t.Fatalf("total %d, want the 3 accepted events", got)
	}
	if c := srv.MeterEventCounts(); c.Invalid != 2 {
		t.Fatalf("counts %+v", c)
	}
}

func TestMeterEventValues(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	for _, bad := range []string{"2.5", "1e3", "", "ten", "--1", "1234567890123456"} {
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", bad, "", 0))
		if se := stripeErr(t, err, http.StatusBadRequest); se.Param != "payload[value]" {
			t.Errorf("value %q: param %q", bad, se.Param)
		}
	}
	for _, good := range []string{"-3", "+4", "999999999999999", "0"} {
		if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", good, "", 0)); err != nil {
			t.Errorf("value %q refused: %v", good, err)
		}
	}
	if got, want := srv.MeterTotal("api_calls", "cus_a"), int64(999999999999999+1); got != want {
		t.Fatalf("total %d, want %d", got, want)
	}
	_, err := sc.BillingMeterEvents.New(eventParams("no_such_meter", "cus_a", "1", "", 0))
	if se := stripeErr(t, err, http.StatusBadRequest); se.Param != "event_name" || !strings.Contains(se.Msg, "No active meter") {
		t.Fatalf("unknown meter: %+v", se)
	}
	_, err = sc.BillingMeterEvents.New(&stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"),
		Payload: map[string]string{"value": "1"}})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Code != stripe.ErrorCodeParameterMissing {
		t.Fatalf("no customer: %+v", se)
	}
	_, err = sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", strings.Repeat("i", 101), 0))
	stripeErr(t, err, http.StatusBadRequest)
	// A count meter counts events whatever their value, and needs none.
	newMeter(t, sc, "logins", FormulaCount)
	for _, v := range []string{"7", "1"} {
		if _, err := sc.BillingMeterEvents.New(eventParams("logins", "cus_c", v, "", 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sc.BillingMeterEvents.New(&stripe.BillingMeterEventParams{EventName: stripe.String("logins"),
		Payload: map[string]string{"stripe_customer_id": "cus_c"}}); err != nil {
		t.Fatal(err)
	}
	if got := srv.MeterTotal("logins", "cus_c"); got != 3 {
		t.Fatalf("count total %d, want 3", got)
	}
}

// Stripe allows one concurrent meter-event call per customer per meter.
// The first call is held in flight by the hook until the others have had
// their answers: no sleep decides the order.
func TestMeterEventConcurrencyRule(t *testing.T) {
	t.Parallel()
	inFlight, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool // not a sync.Once: its Do would block the other callers too
	srv, sc := setup(t, Config{OnMeterEventInFlight: func(customer, _ string) {
		if customer == "cus_a" && held.CompareAndSwap(false, true) {
			close(inFlight)
			<-release
		}
	}})
	newMeter(t, sc, "api_calls", FormulaSum)
	newMeter(t, sc, "tokens", FormulaSum)
	first := make(chan error, 1)
	go func() {
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "c-1", 0))
		first <- err
	}()
	<-inFlight
	_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "2", "c-2", 0))
	if se := stripeErr(t, err, http.StatusTooManyRequests); se.Code != stripe.ErrorCodeRateLimit || se.Type != stripe.ErrorTypeInvalidRequest {
		t.Fatalf("concurrent call: %+v", se)
	}
	// Another customer of the meter, and the customer on another meter,
	// are not held back.
	if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_b", "1", "c-3", 0)); err != nil {
		t.Fatalf("other customer: %v", err)
	}
	if _, err := sc.BillingMeterEvents.New(eventParams("tokens", "cus_a", "1", "c-4", 0)); err != nil {
		t.Fatalf("other meter: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first: %v", err)
	}
	// The slot is free again; the refused call was not recorded, so its
	// identifier is free too.
	if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "2", "c-2", 0)); err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 3 {
		t.Fatalf("total %d, want 3", got)
	}
	if c := srv.MeterEventCounts(); c.Concurrent != 1 || c.Recorded != 4 {
		t.Fatalf("counts %+v", c)
	}
}

// MeterEventLatency keeps a call in flight: a second call for the same
// customer and meter meanwhile is refused.
func TestMeterEventLatencyHoldsTheSlot(t *testing.T) {
	t.Parallel()
	inFlight := make(chan struct{}, 1)
	srv, sc := setup(t, Config{
		Faults:               Faults{MeterEventLatency: 2 * time.Second},
		OnMeterEventInFlight: func(string, string) { inFlight <- struct{}{} },
	})
	newMeter(t, sc, "api_calls", FormulaSum)
	first := make(chan error, 1)
	go func() {
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "l-1", 0))
		first <- err
	}()
	<-inFlight // the slot is taken; the call stays 2 s
	_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "l-2", 0))
	stripeErr(t, err, http.StatusTooManyRequests)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if c := srv.MeterEventCounts(); c.Concurrent != 1 || c.Recorded != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// Meter events have a rate limit of their own; a live key's meter events
// do not count against the basic limit, a test key's do (Stripe's rate
// limits page).
func TestMeterEventRateLimits(t *testing.T) {
	t.Parallel()
	// 0.001 rps: buckets cannot refill during the test.
	srv, sc := setup(t, Config{Faults: Faults{MeterEventRateLimit: 0.001, MeterEventRateBurst: 2}})
	newMeter(t, sc, "api_calls", FormulaSum)
	for i := range 2 {
		if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "r-"+strconv.Itoa(i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "r-2", 0))
	if se := stripeErr(t, err, http.StatusTooManyRequests); se.Code != stripe.ErrorCodeRateLimit {
		t.Fatalf("code %s", se.Code)
	}
	// Other endpoints are not in the meter-event bucket.
	if _, err := sc.Customers.New(&stripe.CustomerParams{}); err != nil {
		t.Fatalf("customer create under a spent meter-event bucket: %v", err)
	}
	if c := srv.MeterEventCounts(); c.RateLimited != 1 || c.Recorded != 2 {
		t.Fatalf("counts %+v", c)
	}

	t.Run("live meter events outside the basic limit", func(t *testing.T) {
		t.Parallel()
		srv, sc := setup(t, Config{Faults: Faults{RateLimit: 0.001, RateBurst: 2}})
		live := newClient(t, srv, clientOpts{key: "sk_live_pelguard_0123456789"})
		newMeter(t, sc, "api_calls", FormulaSum) // the basic bucket's first token
		if _, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "t-1", 0)); err != nil {
			t.Fatal(err) // a test key's meter event takes the second
		}
		_, err := sc.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "t-2", 0))
		stripeErr(t, err, http.StatusTooManyRequests)
		for i := range 3 {
			if _, err := live.BillingMeterEvents.New(eventParams("api_calls", "cus_a", "1", "live-"+strconv.Itoa(i), 0)); err != nil {
				t.Fatalf("live meter event %d under a spent basic bucket: %v", i, err)
			}
		}
		if got := srv.MeterTotal("api_calls", "cus_a"); got != 4 {
			t.Fatalf("total %d, want 4", got)
		}
	})
}
