package stripeapi_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// meterT0 is the emulator's frozen start in these tests.
var meterT0 = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

// meterSetup starts an emulator at meterT0 with a sum meter api_calls and
// returns it with a client.
func meterSetup(t *testing.T, cfg stripesim.Config, ccfg stripeapi.Config) (*stripesim.Server, *stripeapi.Client) {
	t.Helper()
	cfg.Now = meterT0
	srv := newSim(t, cfg)
	c := simClient(t, srv, ccfg)
	if _, err := c.CreateMeter(t.Context(), stripeapi.MeterSpec{EventName: "api_calls"}); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func usage(customer, identifier string, value int64) stripeapi.MeterEvent {
	return stripeapi.MeterEvent{EventName: "api_calls", StripeCustomerID: customer, Value: value, Identifier: identifier, Timestamp: meterT0}
}

func TestMeterEventSentOnce(t *testing.T) {
	t.Parallel()
	srv, c := meterSetup(t, stripesim.Config{}, stripeapi.Config{})
	res, err := c.SendMeterEvent(t.Context(), usage("cus_a", "evt-1", 5))
	if err != nil || res.Identifier != "evt-1" || !res.Timestamp.Equal(meterT0) || res.Replayed {
		t.Fatalf("send = %+v, %v", res, err)
	}
	// The same event again: its Idempotency-Key derives from the
	// identifier, so Stripe answers from its record.
	res, err = c.SendMeterEvent(t.Context(), usage("cus_a", "evt-1", 5))
	if err != nil || !res.Replayed {
		t.Fatalf("resend = %+v, %v; want the recorded answer replayed", res, err)
	}
	// Another value under the same identifier is a bug, not a delivery.
	_, err = c.SendMeterEvent(t.Context(), usage("cus_a", "evt-1", 6))
	wantKind(t, err, stripeapi.ErrIdempotencyMismatch, 400)
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 5 {
		t.Fatalf("total %d, want 5", got)
	}
	meters, err := c.ListMeters(t.Context())
	if err != nil || len(meters) != 1 || meters[0].EventName != "api_calls" || meters[0].Formula != stripeapi.MeterFormulaSum ||
		meters[0].CustomerKey != "stripe_customer_id" || meters[0].ValueKey != "value" || meters[0].Status != "active" {
		t.Fatalf("meters = %+v, %v", meters, err)
	}
}

// An identifier Stripe already holds, sent under another Idempotency-Key
// (another sender, or after Stripe pruned the key), is refused:
// ErrDuplicateIdentifier, which callers count as delivered.
func TestMeterEventDuplicateIdentifier(t *testing.T) {
	t.Parallel()
	srv, c := meterSetup(t, stripesim.Config{}, stripeapi.Config{})
	raw := rawClient(t, srv) // stripe-go's own random Idempotency-Key
	if _, err := raw.BillingMeterEvents.New(&stripe.BillingMeterEventParams{
		EventName: stripe.String("api_calls"), Identifier: stripe.String("evt-9"),
		Payload: map[string]string{"stripe_customer_id": "cus_a", "value": "5"},
	}); err != nil {
		t.Fatal(err)
	}
	_, err := c.SendMeterEvent(t.Context(), usage("cus_a", "evt-9", 5))
	wantKind(t, err, stripeapi.ErrDuplicateIdentifier, 400)
	if errors.Is(err, stripeapi.ErrInvalidRequest) || errors.Is(err, stripeapi.ErrTransient) {
		t.Fatalf("a duplicate must be neither invalid nor transient: %v", err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 5 {
		t.Fatalf("total %d, want 5", got)
	}
}

func rawClient(t *testing.T, srv *stripesim.Server) *client.API {
	t.Helper()
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL()), MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}, EnableTelemetry: stripe.Bool(false),
	})
	return client.New(simKey, &stripe.Backends{API: b, Connect: b, Uploads: b})
}

// Stripe's one concurrent call per customer per meter: the second call is
// refused 429, a transient error (send it again later), and the limiter
// hears of it.
func TestMeterEventConcurrencyIsTransient(t *testing.T) {
	t.Parallel()
	inFlight, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	meterLim, general := &recordingLimiter{}, &recordingLimiter{}
	srv, c := meterSetup(t, stripesim.Config{OnMeterEventInFlight: func(string, string) {
		if held.CompareAndSwap(false, true) {
			close(inFlight)
			<-release
		}
	}}, stripeapi.Config{Limiter: general, MeterLimiter: meterLim, MaxNetworkRetries: stripeapi.NoRetries})
	first := make(chan error, 1)
	go func() { _, err := c.SendMeterEvent(t.Context(), usage("cus_a", "evt-1", 1)); first <- err }()
	<-inFlight
	_, err := c.SendMeterEvent(t.Context(), usage("cus_a", "evt-2", 1))
	close(release)
	wantKind(t, err, stripeapi.ErrTransient, 429)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendMeterEvent(t.Context(), usage("cus_a", "evt-2", 1)); err != nil {
		t.Fatalf("sent again once the first ended: %v", err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 2 {
		t.Fatalf("total %d, want 2", got)
	}
	// Meter events waited on MeterLimiter only, and it heard the 429;
	// the meter's creation and a cancel are general calls.
	if err := c.CancelMeterEvent(t.Context(), "api_calls", "evt-2"); err != nil {
		t.Fatal(err)
	}
	const ep = "POST /v1/billing/meter_events"
	if len(meterLim.waits) != 3 || meterLim.waits[0] != ep || len(meterLim.limited) != 1 || meterLim.limited[0] != ep {
		t.Errorf("meter limiter: waits %v, 429s %v", meterLim.waits, meterLim.limited)
	}
	if strings.Join(general.waits, ",") != "POST /v1/billing/meters,POST /v1/billing/meter_event_adjustments" || len(general.limited) != 0 {
		t.Errorf("general limiter: waits %v, 429s %v", general.waits, general.limited)
	}
}

func TestMeterEventRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	srv, c := meterSetup(t, stripesim.Config{}, stripeapi.Config{})
	old := usage("cus_a", "old", 1)
	old.Timestamp = meterT0.Add(-stripeapi.MeterEventMaxAge - time.Minute)
	_, err := c.SendMeterEvent(t.Context(), old)
	wantKind(t, err, stripeapi.ErrInvalidRequest, 400)
	if se := (*stripeapi.Error)(nil); !errors.As(err, &se) || se.Param != "timestamp" {
		t.Fatalf("param of %v", err)
	}
	ahead := usage("cus_a", "ahead", 1)
	ahead.Timestamp = meterT0.Add(stripeapi.MeterEventMaxFuture + time.Minute)
	_, err = c.SendMeterEvent(t.Context(), ahead)
	wantKind(t, err, stripeapi.ErrInvalidRequest, 400)
	unknown := usage("cus_a", "u", 1)
	unknown.EventName = "no_such_meter"
	_, err = c.SendMeterEvent(t.Context(), unknown)
	wantKind(t, err, stripeapi.ErrInvalidRequest, 400)

	// Checked before sending: nothing reaches Stripe.
	before := srv.Requests()["POST /v1/billing/meter_events"]
	for name, ev := range map[string]stripeapi.MeterEvent{
		"identifier of 101": usage("cus_a", strings.Repeat("x", 101), 1),
		"16 digits":         usage("cus_a", "big", 1_000_000_000_000_000),
		"no customer":       usage("", "nc", 1),
	} {
		_, err := c.SendMeterEvent(t.Context(), ev)
		if !errors.Is(err, stripeapi.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if got := srv.Requests()["POST /v1/billing/meter_events"]; got != before {
		t.Fatalf("%d invalid events reached Stripe", got-before)
	}
	if err := stripeapi.CheckMeterTimestamp(old.Timestamp, meterT0); !errors.Is(err, stripeapi.ErrInvalidRequest) {
		t.Errorf("CheckMeterTimestamp(36 days ago) = %v", err)
	}
	if err := stripeapi.CheckMeterTimestamp(meterT0.Add(-stripeapi.MeterEventMaxAge), meterT0); err != nil {
		t.Errorf("CheckMeterTimestamp(35 days ago) = %v", err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 0 {
		t.Fatalf("total %d, want 0", got)
	}
}

// "Recorded, response lost": the call times out after Stripe recorded the
// event; the resend under the same identifier is answered from Stripe's
// record and the event counts once.
func TestMeterEventResponseLost(t *testing.T) {
	t.Parallel()
	srv, c := meterSetup(t, stripesim.Config{Faults: stripesim.Faults{DropNextMeterEvents: 1, DropHang: true}},
		stripeapi.Config{Timeout: 300 * time.Millisecond, MaxNetworkRetries: stripeapi.NoRetries})
	_, err := c.SendMeterEvent(t.Context(), usage("cus_a", "lost-1", 4))
	wantKind(t, err, stripeapi.ErrTransient, 0)
	res, err := c.SendMeterEvent(t.Context(), usage("cus_a", "lost-1", 4))
	if err != nil || !res.Replayed {
		t.Fatalf("resend = %+v, %v", res, err)
	}
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 4 {
		t.Fatalf("total %d, want 4", got)
	}
}

func TestMeterCancelAndSummaries(t *testing.T) {
	t.Parallel()
	srv, c := meterSetup(t, stripesim.Config{}, stripeapi.Config{})
	for i, at := range []time.Duration{-2 * time.Hour, -time.Hour, -time.Minute} {
		ev := usage("cus_a", fmt.Sprintf("s-%d", i), []int64{3, 4, 10}[i])
		ev.Timestamp = meterT0.Add(at)
		if _, err := c.SendMeterEvent(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
	meters, err := c.ListMeters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id := meters[0].ID
	day := meterT0.Truncate(24 * time.Hour)
	got, err := c.MeterEventSummaries(t.Context(), id, "cus_a", day, day.Add(24*time.Hour), stripeapi.MeterWindowHour)
	if err != nil {
		t.Fatal(err)
	}
	want := []stripeapi.MeterSummary{
		{Start: meterT0.Add(-2 * time.Hour), End: meterT0.Add(-time.Hour), Value: 3},
		{Start: meterT0.Add(-time.Hour), End: meterT0, Value: 14},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("hourly = %v, want %v (oldest first)", got, want)
	}
	if err := c.CancelMeterEvent(t.Context(), "api_calls", "s-2"); err != nil {
		t.Fatal(err)
	}
	got, err = c.MeterEventSummaries(t.Context(), id, "cus_a", day, day.Add(24*time.Hour), stripeapi.MeterWindowNone)
	if err != nil || len(got) != 1 || got[0].Value != 7 {
		t.Fatalf("whole day after the cancel = %v, %v; want 7", got, err)
	}
	srv.Advance(stripeapi.MeterCancelWindow)
	err = c.CancelMeterEvent(t.Context(), "api_calls", "s-1")
	wantKind(t, err, stripeapi.ErrInvalidRequest, 400)
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 7 {
		t.Fatalf("total %d, want 7", got)
	}
	_, err = c.MeterEventSummaries(t.Context(), id, "cus_a", day.Add(time.Minute), day.Add(24*time.Hour), stripeapi.MeterWindowDay)
	wantKind(t, err, stripeapi.ErrInvalidRequest, 400)
}

// The duplicate refusal is matched loosely (its message is reported, not
// documented); anything else stays what it was.
func TestDuplicateIdentifierMatching(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		body   string
		kind   error
	}{
		{400, `{"error":{"type":"invalid_request_error","message":"An event already exists with identifier evt-1."}}`, stripeapi.ErrDuplicateIdentifier},
		{400, `{"error":{"type":"invalid_request_error","message":"AN EVENT ALREADY EXISTS WITH IDENTIFIER evt-1"}}`, stripeapi.ErrDuplicateIdentifier},
		{400, `{"error":{"type":"invalid_request_error","message":"This identifier has already been used for a meter event."}}`, stripeapi.ErrDuplicateIdentifier},
		{400, `{"error":{"type":"invalid_request_error","message":"No active meter found for event_name x."}}`, stripeapi.ErrInvalidRequest},
		{429, `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"An event already exists with identifier evt-1."}}`, stripeapi.ErrTransient},
		{400, `{"error":{"message":"An event already exists with identifier evt-1."}}`, stripeapi.ErrTransient}, // not Stripe's body
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		c, err := stripeapi.New(stripeapi.Config{APIKey: simKey, BaseURL: srv.URL, MaxNetworkRetries: stripeapi.NoRetries})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.SendMeterEvent(t.Context(), usage("cus_a", "evt-1", 1))
		srv.Close()
		if !errors.Is(err, tc.kind) {
			t.Errorf("%d %s: %v, want %v", tc.status, tc.body, err, tc.kind)
		}
	}
}

func TestEndpointNamesNamespacedResources(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		"/v1/billing/meter_events":                   "POST /v1/billing/meter_events",
		"/v1/billing/meter_event_adjustments":        "POST /v1/billing/meter_event_adjustments",
		"/v1/billing/meters/mtr_1/event_summaries":   "POST /v1/billing/meters/{id}/event_summaries",
		"/v1/checkout/sessions/cs_1":                 "POST /v1/checkout/sessions/{id}",
		"/v1/payment_intents/pi_1/cancel":            "POST /v1/payment_intents/{id}/cancel",
		"/v1/billing_portal/configurations/bpc_1234": "POST /v1/billing_portal/configurations/{id}",
	} {
		if got := stripeapi.Endpoint("POST", path); got != want {
			t.Errorf("Endpoint(POST, %s) = %q, want %q", path, got, want)
		}
	}
}

// TestStripeGoLogsWhatOnlyItKnows: stripe-go logs through the client's
// logger. A refusal it would log as an error of its own ("Request error
// from Stripe (status 400) …") is returned to the caller, which says what
// it means once: it is not in the log at info. A retry stripe-go decides
// on its own is: a warning naming the attempt.
func TestStripeGoLogsWhatOnlyItKnows(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv, c := meterSetup(t, stripesim.Config{}, stripeapi.Config{Logger: logger, MaxNetworkRetries: 1})
	unknown := usage("cus_a", "u", 1)
	unknown.EventName = "no_such_meter"
	for range 3 {
		_, err := c.SendMeterEvent(t.Context(), unknown)
		wantKind(t, err, stripeapi.ErrInvalidRequest, 400)
	}
	if err := srv.SetFaults(stripesim.Faults{ErrorRate: 1, ErrorShouldRetry: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendMeterEvent(t.Context(), usage("cus_a", "r", 1)); err == nil {
		t.Fatal("every request fails, the event was sent")
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if strings.Contains(out, "Request error from Stripe") || strings.Contains(out, "no_such_meter") {
		t.Errorf("stripe-go's line for a returned refusal is in the log:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN msg=\"Initiating retry 1 for request POST") || !strings.Contains(out, "component=stripe-go") {
		t.Errorf("stripe-go's retry is not in the log as a warning:\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
