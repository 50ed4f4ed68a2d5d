package stripesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
)

func TestInjected500And429(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{ErrorRate: 1}})
	_, err := sc.Charges.New(newChargeParams("cus_f", 100, "k-500"))
	if se := stripeErr(t, err, http.StatusInternalServerError); se.Type != stripe.ErrorTypeAPI {
		t.Fatalf("type %s", se.Type)
	}
	if err := srv.SetFaults(Faults{RateLimitedRate: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.Charges.New(newChargeParams("cus_f", 100, "k-500"))
	if se := stripeErr(t, err, http.StatusTooManyRequests); se.Code != stripe.ErrorCodeRateLimit {
		t.Fatalf("code %s", se.Code)
	}
	// Injected faults happen before execution and are not cached: the same
	// key now executes.
	if err := srv.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	ch, err := sc.Charges.New(newChargeParams("cus_f", 100, "k-500"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" || srv.ChargeCreates() != 1 {
		t.Fatalf("after faults cleared: %v", err)
	}
}

func TestInjected500WithShouldRetryIsRetriedByStripeGo(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{Faults: Faults{ErrorRate: 1, ErrorShouldRetry: true}})
	sc := newClient(t, srv, clientOpts{retries: 3})
	_, err := sc.Charges.New(newChargeParams("cus_f", 100, ""))
	stripeErr(t, err, http.StatusInternalServerError)
	if n := srv.Requests()["POST /v1/charges"]; n != 4 {
		t.Fatalf("stripe-go should retry a POST 500 with Stripe-Should-Retry: %d requests", n)
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	// 0.001 rps: the bucket of 2 cannot refill during the test.
	_, sc := setup(t, Config{Faults: Faults{RateLimit: 0.001, RateBurst: 2}})
	for range 2 {
		if _, err := sc.Customers.New(&stripe.CustomerParams{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := sc.Customers.New(&stripe.CustomerParams{})
	if se := stripeErr(t, err, http.StatusTooManyRequests); se.Code != stripe.ErrorCodeRateLimit {
		t.Fatalf("code %s", se.Code)
	}
}

func TestDeclines(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DeclineCustomers: []string{"cus_broke"}}})
	_, err := sc.Charges.New(newChargeParams("cus_broke", 100, "k-decl"))
	se := stripeErr(t, err, http.StatusPaymentRequired)
	if se.Type != stripe.ErrorTypeCard || se.Code != stripe.ErrorCodeCardDeclined || se.DeclineCode != stripe.DeclineCodeGenericDecline || se.ChargeID == "" {
		t.Fatalf("decline %+v", se)
	}
	ch, ok := srv.Charge(se.ChargeID)
	if !ok || ch.Status != "failed" {
		t.Fatalf("declined charge %+v", ch)
	}
	// The decline executed, so it replays.
	_, err = sc.Charges.New(newChargeParams("cus_broke", 100, "k-decl"))
	if se := stripeErr(t, err, http.StatusPaymentRequired); se.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("decline not replayed")
	}
	_, err = sc.PaymentIntents.New(intentParams("cus_broke", 100))
	se = stripeErr(t, err, http.StatusPaymentRequired)
	if se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("intent decline %+v", se.PaymentIntent)
	}
	if srv.ChargeCreates() != 2 || len(srv.Duplicates()) != 0 {
		t.Fatal("declines are charges but not billable")
	}
}

// noKeepAlive gives each request a fresh connection: Go's transport only
// replays a dropped request itself on a reused connection (see DropHang).
func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

func TestCommitThenDrop(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{Faults: Faults{DropNextCharges: 1}})
	sc := newClient(t, srv, clientOpts{httpClient: noKeepAlive()})
	_, err := sc.Charges.New(newChargeParams("cus_d", 100, "k-drop"))
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want a transport error, got %v", err)
	}
	if got := srv.Charges(); len(got) != 1 || got[0].IdempotencyKey != "k-drop" {
		t.Fatalf("charge not committed: %+v", got)
	}
	if srv.Faults().DropNextCharges != 0 {
		t.Fatal("drop budget not spent")
	}
	ch, err := sc.Charges.New(newChargeParams("cus_d", 100, "k-drop"))
	if err != nil || ch.ID != srv.Charges()[0].ID || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %v", err)
	}
	if srv.ChargeCreates() != 1 {
		t.Fatal("retry created a second charge")
	}
}

func TestCommitThenDropRetriedByStripeGo(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{Faults: Faults{DropNextCharges: 1}})
	sc := newClient(t, srv, clientOpts{httpClient: noKeepAlive(), retries: 2})
	// stripe-go generates one Idempotency-Key per call and reuses it on its
	// network retries, so the retry is answered from the idempotency record.
	ch, err := sc.Charges.New(newChargeParams("cus_d", 100, ""))
	if err != nil {
		t.Fatal(err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" || srv.ChargeCreates() != 1 ||
		srv.Requests()["POST /v1/charges"] != 2 {
		t.Fatalf("replayed=%q creates=%d", ch.LastResponse.Header.Get("Idempotent-Replayed"), srv.ChargeCreates())
	}
}

func TestCommitThenDropIntent(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{Faults: Faults{DropRate: 1}})
	sc := newClient(t, srv, clientOpts{httpClient: noKeepAlive()})
	p := intentParams("cus_d", 100)
	p.SetIdempotencyKey("k-pi")
	if _, err := sc.PaymentIntents.New(p); err == nil {
		t.Fatal("want error")
	}
	if err := srv.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	pi, err := sc.PaymentIntents.New(p)
	if err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded || srv.ChargeCreates() != 1 {
		t.Fatalf("retry %v", err)
	}
}

// DropHang models a timeout: the client gives up, the charge exists.
func TestCommitThenHang(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DropNextCharges: 1, DropHang: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	p := newChargeParams("cus_h", 100, "k-hang")
	p.Context = ctx
	_, err := sc.Charges.New(p)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
	if srv.ChargeCreates() != 1 {
		t.Fatal("charge not committed")
	}
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	post := func(path string, body any) *http.Response {
		b, _ := json.Marshal(body)
		resp, err := http.Post(srv.URL()+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	var fj FaultsJSON
	fj.ErrorRate = 1
	fj.Latency.Fixed = "1ms"
	fj.PageLatency = map[string]string{"/v1/charges": "50ms"}
	if resp := post("/_sim/faults", fj); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f := srv.Faults(); f.ErrorRate != 1 || f.Latency.Fixed != time.Millisecond || f.PageLatency["/v1/charges"] != 50*time.Millisecond {
		t.Fatalf("faults %+v", f)
	}
	_, err := sc.Charges.New(newChargeParams("cus_a", 100, ""))
	stripeErr(t, err, http.StatusInternalServerError)
	if resp := post("/_sim/faults", map[string]any{"latency": map[string]string{"fixed": "soon"}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatal("bad duration accepted")
	}
	if resp := post("/_sim/faults", map[string]any{"page_latency": map[string]string{"/v1/charges": "50ms"}}); resp.StatusCode != http.StatusOK {
		t.Fatal("reset")
	}
	srv.SeedCharge(ChargeSeed{Customer: "cus_a", Amount: 5})
	start := time.Now()
	if got := listAll(t, sc.Charges.List(&stripe.ChargeListParams{})); len(got) != 1 {
		t.Fatal("list")
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatal("page latency not applied")
	}
	resp, err := http.Get(srv.URL() + "/_sim/charges")
	if err != nil {
		t.Fatal(err)
	}
	var charges []Charge
	err = json.NewDecoder(resp.Body).Decode(&charges)
	resp.Body.Close()
	if err != nil || len(charges) != 1 || charges[0].Amount != 5 {
		t.Fatalf("admin charges %v %v", charges, err)
	}
	if resp := post("/_sim/advance", map[string]string{"duration": "24h"}); resp.StatusCode != http.StatusOK || !srv.Now().Equal(t0.Add(24*time.Hour)) {
		t.Fatal("advance")
	}
}

func TestFaultsValidate(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Faults: Faults{ErrorRate: 2}}); err == nil {
		t.Fatal("ErrorRate 2 accepted")
	}
	if err := (Faults{Latency: Latency{Min: 2, Max: 1}}).Validate(); err == nil {
		t.Fatal("Max < Min accepted")
	}
}

func TestLatencyIsSeededAndBounded(t *testing.T) {
	t.Parallel()
	a, b := MustNew(Config{Seed: 7}), MustNew(Config{Seed: 7})
	defer a.Close()
	defer b.Close()
	for range 20 {
		x, y := a.faults.uniform(time.Millisecond, 9*time.Millisecond), b.faults.uniform(time.Millisecond, 9*time.Millisecond)
		if x != y || x < time.Millisecond || x >= 9*time.Millisecond {
			t.Fatalf("%v %v", x, y)
		}
	}
}

// TestCommitThenDropOnReusedConnection documents a net/http behaviour the
// consumer must not rely on either way: when a reused keep-alive connection
// is closed without a reply, Go's transport itself replays a POST that
// carries Idempotency-Key (Request.isReplayable), even with
// MaxNetworkRetries 0. The replay is answered from the idempotency record,
// so the caller usually sees success and no double charge; on a fresh
// connection it sees the error instead (TestCommitThenDrop).
func TestCommitThenDropOnReusedConnection(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DropNextCharges: 1}})
	if _, err := sc.Customers.New(&stripe.CustomerParams{}); err != nil { // warm a keep-alive connection
		t.Fatal(err)
	}
	ch, err := sc.Charges.New(newChargeParams("cus_d", 100, "k-ka"))
	if err == nil && ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("success without replay")
	}
	t.Logf("transport replayed silently: %v", err == nil)
	if srv.ChargeCreates() != 1 {
		t.Fatal("double charge")
	}
}

// TestFaultsValidateCardErrorAndAdviceCodes: an advice code Stripe does not
// send, or an empty card error code, is refused at start.
func TestFaultsValidateCardErrorAndAdviceCodes(t *testing.T) {
	t.Parallel()
	for _, f := range []Faults{
		{AdviceCodes: map[string]string{"cus_1": "retry_tomorrow"}},
		{CardErrorCodes: map[string]string{"cus_1": ""}},
	} {
		if err := f.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted", f)
		}
	}
	ok := Faults{AdviceCodes: map[string]string{"cus_1": "try_again_later"}, CardErrorCodes: map[string]string{"cus_2": "processing_error"}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if back, err := ok.ToJSON().Faults(); err != nil || back.AdviceCodes["cus_1"] != "try_again_later" || back.CardErrorCodes["cus_2"] != "processing_error" {
		t.Errorf("JSON round trip: %+v %v", back, err)
	}
}

// TestFaultErrorsNameTheJSONField: a fault POST /_sim/faults refuses is
// named as the request spelled it (error_rate, meter_event_latency), not
// by the Go field behind it.
func TestFaultErrorsNameTheJSONField(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	for body, want := range map[string]string{
		`{"error_rate":2}`:                    "error_rate 2: want a fraction from 0 to 1",
		`{"meter_event_latency":"-1s"}`:       "meter_event_latency: want 0 or more",
		`{"rate_limit":-1}`:                   "rate_limit: want 0 or more",
		`{"latency":{"tail_prob":1.5}}`:       "latency.tail_prob 1.5: want a fraction from 0 to 1",
		`{"decline_codes":{"cus_a":""}}`:      `is empty: want a decline code`,
		`{"drop_next_meter_events":-2}`:       "drop_next_meter_events: want 0 or more",
		`{"latency":{"min":"2s","max":"1s"}}`: "latency (fixed 0s, min 2s, max 1s, tail 0s): want durations of 0 or more and max at least min",
	} {
		resp, err := http.Post(srv.URL()+"/_sim/faults", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), want) || regexp.MustCompile(`[A-Z][a-z]+[A-Z]`).Match(b) {
			t.Errorf("POST %s: %d %s: want 400 naming %q and no Go field", body, resp.StatusCode, b, want)
		}
	}
}
