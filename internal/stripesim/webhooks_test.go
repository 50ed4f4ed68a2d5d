package stripesim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/stripemocktest"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"
)

// received is one delivery as a receiver using stripe-go's webhook package
// saw it.
type received struct {
	ev  stripe.Event
	err error
}

// newReceiver is a webhook endpoint that verifies with stripe-go's
// ConstructEvent (signature, 5-minute tolerance, API version) and answers
// 400 when verification fails, as a correct endpoint does.
func newReceiver(t *testing.T, secret string) (url string, got <-chan received) {
	t.Helper()
	ch := make(chan received, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := webhook.ConstructEvent(body, r.Header.Get("Stripe-Signature"), secret)
		ch <- received{ev, err}
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

func next(t *testing.T, got <-chan received) received {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivery within 10 s")
		return received{}
	}
}

func TestWebhookDeliveredWithVerifiableSignature(t *testing.T) {
	t.Parallel()
	url, got := newReceiver(t, "whsec_test_secret")
	_, sc := setup(t, Config{Webhook: Webhook{URL: url, Secret: "whsec_test_secret"}})
	pi, err := sc.PaymentIntents.New(offSessionIntent("cus_ok", 1200, "k-wh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []stripe.EventType{"charge.succeeded", "payment_intent.succeeded"} {
		r := next(t, got)
		if r.err != nil {
			t.Fatalf("%s: stripe-go rejected the event: %v", want, r.err)
		}
		if r.ev.Type != want || r.ev.APIVersion != stripe.APIVersion || r.ev.Request == nil || r.ev.Request.IdempotencyKey != "k-wh" {
			t.Fatalf("event %+v, want %s", r.ev, want)
		}
		if want == "payment_intent.succeeded" {
			var typed stripe.PaymentIntent
			if err := json.Unmarshal(r.ev.Data.Raw, &typed); err != nil || typed.ID != pi.ID || typed.Status != stripe.PaymentIntentStatusSucceeded {
				t.Fatalf("data.object: %v %+v", err, typed)
			}
		}
	}
}

func TestWebhookWrongSecretFailsVerification(t *testing.T) {
	t.Parallel()
	url, got := newReceiver(t, "whsec_right")
	srv, sc := setup(t, Config{Webhook: Webhook{URL: url, Secret: "whsec_wrong", Hold: true}})
	if _, err := sc.Charges.New(newChargeParams("cus_ok", 100, "k-wrong")); err != nil {
		t.Fatal(err)
	}
	evs := srv.Events()
	if len(evs) != 1 || evs[0].Type != "charge.succeeded" {
		t.Fatalf("events %+v", evs)
	}
	ds, err := srv.DeliverEvents(t.Context(), evs[0].ID)
	if err != nil || ds[0].Status != http.StatusBadRequest {
		t.Fatalf("delivery %v %+v", err, ds)
	}
	if r := next(t, got); !errors.Is(r.err, webhook.ErrNoValidSignature) {
		t.Fatalf("wrong secret: %v", r.err)
	}
	// A signature older than stripe-go's tolerance fails too.
	srv.SetWebhook(Webhook{URL: url, Secret: "whsec_right", Hold: true, Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	if _, err := srv.DeliverEvents(t.Context(), evs[0].ID); err != nil {
		t.Fatal(err)
	}
	if r := next(t, got); !errors.Is(r.err, webhook.ErrTooOld) {
		t.Fatalf("stale signature: %v", r.err)
	}
	if _, err := srv.DeliverEvents(t.Context(), "evt_nope"); !errors.Is(err, ErrNoSuchEvent) {
		t.Fatalf("unknown event: %v", err)
	}
}

// TestWebhookOutOfOrderAndReplay holds the events of a failed debit and
// delivers the failure before the processing, then the failure again.
func TestWebhookOutOfOrderAndReplay(t *testing.T) {
	t.Parallel()
	url, got := newReceiver(t, "whsec_x")
	srv, sc := setup(t, Config{
		Faults:  Faults{DebitCustomers: []string{"cus_ach"}},
		Webhook: Webhook{URL: url, Secret: "whsec_x", Hold: true},
	})
	pi, err := sc.PaymentIntents.New(offSessionIntent("cus_ach", 900, "k-ooo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(pi.ID, false, "account_closed"); err != nil {
		t.Fatal(err)
	}
	byType := map[string]string{}
	for _, e := range srv.Events() {
		byType[e.Type] = e.ID
	}
	order := []string{byType["payment_intent.payment_failed"], byType["payment_intent.processing"], byType["payment_intent.payment_failed"]}
	if slices.Contains(order, "") || byType["charge.pending"] == "" || byType["charge.failed"] == "" {
		t.Fatalf("events %v", byType)
	}
	ds, err := srv.DeliverEvents(t.Context(), order...)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range order {
		r := next(t, got)
		if r.err != nil || r.ev.ID != id || ds[i].Status != http.StatusOK {
			t.Fatalf("delivery %d: %v %s want %s, status %d", i, r.err, r.ev.ID, id, ds[i].Status)
		}
	}
	r := received{}
	var failed stripe.PaymentIntent
	for _, e := range srv.Events() {
		if e.ID == order[0] {
			if len(e.Deliveries) != 2 {
				t.Fatalf("replayed event deliveries %+v", e.Deliveries)
			}
			r.err = json.Unmarshal(e.Payload, &r.ev)
		}
	}
	if r.err != nil || json.Unmarshal(r.ev.Data.Raw, &failed) != nil ||
		failed.Status != stripe.PaymentIntentStatusRequiresPaymentMethod || failed.LastPaymentError.Code != "account_closed" {
		t.Fatalf("payment_failed object: %v %+v", r.err, failed)
	}
}

// everyEvent drives the emulator through each event type it emits and
// returns the recorded events.
func everyEvent(t *testing.T) []Event {
	t.Helper()
	srv, sc := setup(t, Config{Faults: Faults{
		DebitCustomers: []string{"cus_ach"}, DeclineCodes: map[string]string{"cus_broke": "insufficient_funds"},
		AuthRequiredCustomers: []string{"cus_3ds"}, AdviceCodes: map[string]string{"cus_broke": "do_not_try_again"},
	}, Webhook: Webhook{Hold: true}})
	ok, err := sc.PaymentIntents.New(offSessionIntent("cus_ok", 100, "k-1"))
	if err != nil {
		t.Fatal(err)
	}
	debit, err := sc.PaymentIntents.New(offSessionIntent("cus_ach", 100, "k-2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(debit.ID, false, "insufficient_funds"); err != nil {
		t.Fatal(err)
	}
	_, _ = sc.PaymentIntents.New(offSessionIntent("cus_broke", 100, "k-3"))
	p := offSessionIntent("cus_3ds", 100, "k-4")
	p.OffSession = nil
	waiting, err := sc.PaymentIntents.New(p)
	if err != nil {
		t.Fatal(err)
	}
	// The next attempt cancels an intent still waiting for the customer.
	if _, err := sc.PaymentIntents.Cancel(waiting.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.RefundByHand(ok.LatestCharge.ID, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Dispute(ok.LatestCharge.ID); err != nil {
		t.Fatal(err)
	}
	evs := srv.Events()
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	for _, want := range []string{"payment_intent.succeeded", "payment_intent.processing", "payment_intent.payment_failed",
		"payment_intent.requires_action", "payment_intent.canceled", "charge.succeeded", "charge.pending", "charge.failed", "charge.refunded",
		"charge.dispute.created"} {
		if !slices.Contains(types, want) {
			t.Fatalf("no %s event among %v", want, types)
		}
	}
	return evs
}

// jsonFields are the JSON names of a struct type's fields.
func jsonFields(typ reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}

var objectTypes = map[string]reflect.Type{
	"payment_intent": reflect.TypeFor[stripe.PaymentIntent](),
	"charge":         reflect.TypeFor[stripe.Charge](),
	"dispute":        reflect.TypeFor[stripe.Dispute](),
}

// TestEventShapesDecodeIntoStripeGoTypes: every field of every event and
// of its data.object is one stripe-go v76 knows, and it decodes into the
// typed struct.
func TestEventShapesDecodeIntoStripeGoTypes(t *testing.T) {
	t.Parallel()
	envelope := jsonFields(reflect.TypeFor[stripe.Event]())
	for _, e := range everyEvent(t) {
		var top map[string]json.RawMessage
		if err := json.Unmarshal(e.Payload, &top); err != nil {
			t.Fatal(err)
		}
		for k := range top {
			if !envelope[k] {
				t.Errorf("%s: event field %q unknown to stripe.Event", e.Type, k)
			}
		}
		var ev stripe.Event
		if err := json.Unmarshal(e.Payload, &ev); err != nil {
			t.Fatalf("%s: %v", e.Type, err)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(ev.Data.Raw, &obj); err != nil {
			t.Fatal(err)
		}
		var kind string
		_ = json.Unmarshal(obj["object"], &kind)
		typ := objectTypes[kind]
		if typ == nil {
			t.Fatalf("%s: object %q", e.Type, kind)
		}
		known := jsonFields(typ)
		for k := range obj {
			if !known[k] {
				t.Errorf("%s: %s field %q unknown to stripe-go", e.Type, kind, k)
			}
		}
		if err := json.Unmarshal(ev.Data.Raw, reflect.New(typ).Interface()); err != nil {
			t.Errorf("%s: decoding into %s: %v", e.Type, typ, err)
		}
	}
}

// TestEventShapesMatchStripeMock: every field of every data.object exists
// in stripe-mock's fixture of that object (Stripe's OpenAPI spec), so no
// field is invented.
func TestEventShapesMatchStripeMock(t *testing.T) {
	t.Parallel()
	base := stripemocktest.Start(t)
	fixture := func(path string) map[string]json.RawMessage {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+stripemocktest.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return m
	}
	fixtures := map[string]map[string]json.RawMessage{
		"payment_intent": fixture("/v1/payment_intents/pi_123"),
		"charge":         fixture("/v1/charges/ch_123"),
		"dispute":        fixture("/v1/disputes/dp_123"),
	}
	eventFixture := fixture("/v1/events/evt_123")
	for _, e := range everyEvent(t) {
		var ev struct {
			Data struct {
				Object map[string]json.RawMessage `json:"object"`
			} `json:"data"`
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(e.Payload, &ev); err != nil || json.Unmarshal(e.Payload, &top) != nil {
			t.Fatal(err)
		}
		for k := range top {
			if _, ok := eventFixture[k]; !ok && k != "account" {
				t.Errorf("%s: event field %q not in stripe-mock's event", e.Type, k)
			}
		}
		var kind string
		_ = json.Unmarshal(ev.Data.Object["object"], &kind)
		fx := fixtures[kind]
		for k := range ev.Data.Object {
			if _, ok := fx[k]; !ok {
				t.Errorf("%s: %s field %q not in stripe-mock's fixture", e.Type, kind, k)
			}
		}
		if kind == "charge" {
			// charge.outcome too (advice_code is in it): its fields are
			// the fixture's, but for risk_level, which stripe-mock's spec
			// (charge_outcome) has and its fixture leaves out.
			got, want := map[string]json.RawMessage{}, map[string]json.RawMessage{"risk_level": nil}
			_ = json.Unmarshal(ev.Data.Object["outcome"], &got)
			_ = json.Unmarshal(fx["outcome"], &want)
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("%s: charge.outcome field %q not in stripe-mock's fixture", e.Type, k)
				}
			}
		}
	}
}

func TestEventsOnlyRecordedWithAWebhookAndAdminEndpoints(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	if _, err := sc.Charges.New(newChargeParams("cus_ok", 100, "k-none")); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.Events()); n != 0 {
		t.Fatalf("no webhook, yet %d events", n)
	}
	url, got := newReceiver(t, "whsec_adm")
	srv.SetWebhook(Webhook{URL: url, Secret: "whsec_adm", Hold: true})
	if _, err := sc.Charges.New(newChargeParams("cus_ok", 100, "k-adm")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(srv.URL() + "/_sim/events")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	_ = resp.Body.Close()
	if err != nil || len(list) != 1 || list[0].Type != "charge.succeeded" {
		t.Fatalf("GET /_sim/events: %v %+v", err, list)
	}
	resp, err = http.Post(srv.URL()+"/_sim/events/deliver", "application/json",
		strings.NewReader(`{"ids": ["`+list[0].ID+`", "`+list[0].ID+`"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var ds []Delivery
	err = json.NewDecoder(resp.Body).Decode(&ds)
	_ = resp.Body.Close()
	if err != nil || len(ds) != 2 || ds[0].Status != http.StatusOK || ds[1].Status != http.StatusOK {
		t.Fatalf("POST /_sim/events/deliver: %v %+v", err, ds)
	}
	for range 2 {
		if r := next(t, got); r.err != nil || r.ev.ID != list[0].ID {
			t.Fatalf("replay: %v %s", r.err, r.ev.ID)
		}
	}
}
