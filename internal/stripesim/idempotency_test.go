package stripesim

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
)

func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	first, err := sc.Charges.New(newChargeParams("cus_i", 500, "bill-c1-2024-04"))
	if err != nil {
		t.Fatal(err)
	}
	if first.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first response must not be marked replayed")
	}
	srv.Advance(23 * time.Hour)
	second, err := sc.Charges.New(newChargeParams("cus_i", 500, "bill-c1-2024-04"))
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID || second.LastResponse.Header.Get("Idempotent-Replayed") != "true" ||
		second.LastResponse.IdempotencyKey != "bill-c1-2024-04" {
		t.Fatalf("replay: id %s vs %s, headers %v", second.ID, first.ID, second.LastResponse.Header)
	}
	if srv.ChargeCreates() != 1 || len(srv.Charges()) != 1 {
		t.Fatalf("creates = %d", srv.ChargeCreates())
	}
	// Keys are scoped to the API key.
	other := newClient(t, srv, clientOpts{key: "sk_test_other_tenant"})
	third, err := other.Charges.New(newChargeParams("cus_i", 500, "bill-c1-2024-04"))
	if err != nil || third.ID == first.ID {
		t.Fatalf("other api key shared the idempotency key: %v", err)
	}
}

func TestIdempotencyMismatch(t *testing.T) {
	t.Parallel()
	_, sc := setup(t, Config{})
	if _, err := sc.Charges.New(newChargeParams("cus_m", 500, "k1")); err != nil {
		t.Fatal(err)
	}
	_, err := sc.Charges.New(newChargeParams("cus_m", 501, "k1"))
	se := stripeErr(t, err, http.StatusBadRequest)
	if se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("type = %s", se.Type)
	}
	if _, ok := se.Err.(*stripe.IdempotencyError); !ok {
		t.Fatalf("err = %T", se.Err)
	}
}

func TestIdempotencyExpiresAfter24h(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	first, err := sc.Charges.New(newChargeParams("cus_e", 500, "k-exp"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Advance(24*time.Hour - time.Second)
	again, err := sc.Charges.New(newChargeParams("cus_e", 500, "k-exp"))
	if err != nil || again.ID != first.ID {
		t.Fatalf("within window: %v %s", err, again.ID)
	}
	srv.Advance(time.Second)
	fresh, err := sc.Charges.New(newChargeParams("cus_e", 500, "k-exp"))
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == first.ID || fresh.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("expired key should execute again")
	}
	if len(srv.Duplicates()) != 1 {
		t.Fatalf("a replay after 24h is a double charge; Duplicates = %v", srv.Duplicates())
	}
}

// TestIdempotencyKeyInUse holds the first request inside the endpoint with
// the test hook, so the second arrives while it is still running.
func TestIdempotencyKeyInUse(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv.testHookExecute = func(kind string) {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	done := make(chan error, 1)
	go func() {
		_, err := sc.Charges.New(newChargeParams("cus_409", 500, "k-409"))
		done <- err
	}()
	<-entered
	_, err := sc.Charges.New(newChargeParams("cus_409", 500, "k-409"))
	se := stripeErr(t, err, http.StatusConflict)
	if se.Code != stripe.ErrorCodeIdempotencyKeyInUse || se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("409 = %s/%s", se.Type, se.Code)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// After it finishes the key replays.
	ch, err := sc.Charges.New(newChargeParams("cus_409", 500, "k-409"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" || srv.ChargeCreates() != 1 {
		t.Fatalf("after release: %v", err)
	}
}

func TestIdempotencyValidationErrorNotCached(t *testing.T) {
	t.Parallel()
	_, sc := setup(t, Config{})
	bad := newChargeParams("cus_v", 500, "k-v")
	bad.Currency = nil
	_, err := sc.Charges.New(bad)
	stripeErr(t, err, http.StatusBadRequest)
	// Same key, corrected parameters: Stripe did not store the 400.
	if _, err := sc.Charges.New(newChargeParams("cus_v", 500, "k-v")); err != nil {
		t.Fatal(err)
	}
}

// stripe-go refuses keys over 255 characters itself, so this one is hand-built.
func TestIdempotencyKeyTooLong(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{})
	req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/charges",
		strings.NewReader("amount=100&currency=usd"))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", strings.Repeat("k", 256))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode != http.StatusBadRequest || srv.ChargeCreates() != 0 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestIdempotencySweep(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	for _, k := range []string{"a", "b", "c"} {
		if _, err := sc.Customers.New(&stripe.CustomerParams{Params: stripe.Params{IdempotencyKey: stripe.String(k)}}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Advance(25 * time.Hour)
	if _, err := sc.Customers.New(&stripe.CustomerParams{}); err != nil {
		t.Fatal(err)
	}
	if n := srv.idem.len(); n != 1 {
		t.Fatalf("expired keys not swept: %d live", n)
	}
}
