package consumercli

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// seedRow reserves e's row and records outcome o on it, as a consumer would.
func seedRow(t *testing.T, l *ledger.Ledger, e event.Event, o ledger.Outcome) {
	t.Helper()
	ctx := context.Background()
	claim, err := l.Reserve(ctx, ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key("test"), Owner: "test", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Finish(ctx, claim.Record, o); err != nil {
		t.Fatal(err)
	}
}

// The webhook receiver: refuses to start without a signing secret (naming
// the variable, never echoing a wrong value), then settles a processing row
// from a signed event and refuses an unsigned one.
func TestWebhookCommand(t *testing.T) {
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	l := ledger.New(pool, schema, nil)
	e := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 500, BillingPeriod: "2026-11", Currency: "usd"}
	seedRow(t, l, e, ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: "ch_debit", PaymentIntentID: "pi_debit"})

	base := []string{"webhook", "--database-url", url, "--db-schema", schema, "--metrics-addr", "", "--wait-for-deps", "0"}
	t.Setenv("PELGUARD_STRIPE_WEBHOOK_SECRET", "")
	if code, _, errs := call(context.Background(), base...); code != 2 || !strings.Contains(errs, "PELGUARD_STRIPE_WEBHOOK_SECRET is not set") {
		t.Fatalf("no secret: %d %s", code, errs)
	}
	t.Setenv("PELGUARD_STRIPE_WEBHOOK_SECRET", "sk_test_not_a_secret_123")
	if code, _, errs := call(context.Background(), base...); code != 2 || strings.Contains(errs, "sk_test_not_a_secret_123") || !strings.Contains(errs, "whsec_") {
		t.Fatalf("an API key as the secret: %d %s", code, errs)
	}

	const secret = "whsec_cli_test"
	t.Setenv("PELGUARD_STRIPE_WEBHOOK_SECRET", secret)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb testenv.SyncBuffer
	go func() { done <- Main(ctx, append(base, "--listen", addr), &testenv.SyncBuffer{}, &errb) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, "the webhook receiver listens")

	payload := []byte(`{"id":"evt_1","object":"event","type":"charge.succeeded","api_version":"2020-08-27","created":1,` +
		`"data":{"object":{"id":"ch_debit","object":"charge","status":"succeeded","payment_intent":"pi_debit"}}}`)
	post := func(sig string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+consumer.WebhookPath, bytes.NewReader(payload))
		req.Header.Set("Stripe-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("t=1,v1=deadbeef"); code != http.StatusBadRequest {
		t.Fatalf("unsigned: %d", code)
	}
	if r, _ := l.Get(context.Background(), ledger.EventKey(e)); r.Status != ledger.StatusProcessing {
		t.Fatalf("a refused event changed the row: %+v", r)
	}
	// An account on an older webhook API version than stripe-go's.
	if code := post(stripesim.SignPayload(payload, secret, time.Now())); code != http.StatusOK {
		t.Fatalf("signed: %d", code)
	}
	if r, _ := l.Get(context.Background(), ledger.EventKey(e)); r.Status != ledger.StatusCharged || r.ChargeID != "ch_debit" {
		t.Fatalf("after the event: %+v", r)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(errb.String(), secret) {
		t.Fatal("the signing secret reached the log")
	}
}

// consumer retry schedules the next attempt of a declined customer.
func TestRetryCommand(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	l := ledger.New(pool, schema, nil)
	e := event.Event{CustomerID: "c_7", StripeCustomerID: "cus_7", AmountCents: 500, BillingPeriod: "2026-11", Currency: "usd"}
	seedRow(t, l, e, ledger.Outcome{Status: ledger.StatusDeclined, Error: "stolen_card", FailureCode: "stolen_card"})
	if code, _, errs := call(context.Background(), "retry", "--database-url", url, "--db-schema", schema); code != 2 || !strings.Contains(errs, "--period") {
		t.Fatalf("no period: %d %s", code, errs)
	}
	code, out, errs := call(context.Background(), "retry", "--database-url", url, "--db-schema", schema, "--period", "2026-11")
	if code != 0 || !strings.Contains(out, "c_7") || !strings.Contains(out, "scheduled 1 retry") {
		t.Fatalf("retry: %d %s %s", code, out, errs)
	}
	if r, _ := l.Get(context.Background(), ledger.EventKey(e)); r.NextAttemptAt.IsZero() || r.Attempt != 2 {
		t.Fatalf("not scheduled: %+v", r)
	}
}
