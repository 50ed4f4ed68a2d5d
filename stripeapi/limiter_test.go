package stripeapi_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// recordingLimiter records what the client tells a Limiter.
type recordingLimiter struct {
	mu      sync.Mutex
	waits   []string
	limited []string
	refuse  error
}

func (r *recordingLimiter) Wait(_ context.Context, endpoint string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits = append(r.waits, endpoint)
	return r.refuse
}

func (r *recordingLimiter) RateLimited(_ context.Context, endpoint string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limited = append(r.limited, endpoint)
}

// Every attempt waits on the Limiter with its endpoint, every 429 is
// reported, and a Limiter that gives up stops the request before it is sent.
func TestLimiterSeesEveryAttemptAndEvery429(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{Faults: stripesim.Faults{RateLimitedRate: 1}})
	lim := &recordingLimiter{}
	c := simClient(t, srv, stripeapi.Config{Limiter: lim, MaxNetworkRetries: stripeapi.NoRetries})
	_, err := c.GetCharge(context.Background(), "ch_123")
	if !errors.Is(err, stripeapi.ErrTransient) {
		t.Fatalf("GetCharge under 429s: %v; want a transient error", err)
	}
	if len(lim.waits) != 1 || lim.waits[0] != "GET /v1/charges/{id}" {
		t.Errorf("waits %v; want one for GET /v1/charges/{id}", lim.waits)
	}
	if len(lim.limited) != 1 || lim.limited[0] != "GET /v1/charges/{id}" {
		t.Errorf("429s reported %v; want one", lim.limited)
	}

	before := srv.Requests()["GET /v1/charges/{id}"]
	refusing := &recordingLimiter{refuse: context.DeadlineExceeded}
	c = simClient(t, srv, stripeapi.Config{Limiter: refusing, MaxNetworkRetries: stripeapi.NoRetries})
	if _, err := c.GetCharge(context.Background(), "ch_123"); err == nil {
		t.Fatal("a Limiter that gives up must fail the call")
	}
	if got := srv.Requests()["GET /v1/charges/{id}"]; got != before {
		t.Errorf("the request reached Stripe (%d → %d) although the Limiter gave up", before, got)
	}
}

func TestLimiterAndRateLimitTogetherRefused(t *testing.T) {
	t.Parallel()
	_, err := stripeapi.New(stripeapi.Config{APIKey: simKey, Limiter: &recordingLimiter{}, RateLimit: 10})
	if err == nil || !strings.Contains(err.Error(), "drop RateLimit") {
		t.Fatalf("New with both: %v; want an error naming the fix", err)
	}
}

func TestEndpointNamesStripesCounting(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]string{
		"/v1/charges":                      "GET /v1/charges",
		"/v1/charges/ch_1":                 "GET /v1/charges/{id}",
		"/v1/customers/cus_9":              "GET /v1/customers/{id}",
		"/v1/payment_intents/pi_1/confirm": "GET /v1/payment_intents/{id}/confirm",
		"/v1/charges/search":               "GET /v1/charges/search",
	} {
		if got := stripeapi.Endpoint("GET", path); got != want {
			t.Errorf("Endpoint(GET, %s) = %q, want %q", path, got, want)
		}
	}
}
