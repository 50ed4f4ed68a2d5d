package stripesim

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk_test_pelguard_0123456789"

// t0 is the frozen start of every test clock.
var t0 = time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)

// clientOpts tunes the stripe-go backend a test talks through.
type clientOpts struct {
	key        string
	retries    int64
	httpClient *http.Client
}

// setup starts an emulator with a frozen clock at t0 (unless cfg.Now is set)
// and returns it with a stripe-go client that never retries.
func setup(t testing.TB, cfg Config) (*Server, *client.API) {
	t.Helper()
	if cfg.Now.IsZero() {
		cfg.Now = t0
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv, newClient(t, srv, clientOpts{})
}

func newClient(t testing.TB, srv *Server, o clientOpts) *client.API {
	t.Helper()
	if o.key == "" {
		o.key = testKey
	}
	hc := o.httpClient
	if hc == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
		t.Cleanup(tr.CloseIdleConnections)
	}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL()),
		MaxNetworkRetries: stripe.Int64(o.retries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		HTTPClient:        hc,
		EnableTelemetry:   stripe.Bool(false),
	})
	// Retries in tests must not sleep the 0.5 s+ backoff.
	b.(*stripe.BackendImplementation).SetNetworkRetriesSleep(false)
	return client.New(o.key, &stripe.Backends{API: b, Connect: b, Uploads: b})
}

// stripeErr asserts err is a *stripe.Error with the given status.
func stripeErr(t *testing.T, err error, status int) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("want *stripe.Error with status %d, got %T %v", status, err, err)
	}
	if se.HTTPStatusCode != status {
		t.Fatalf("status = %d, want %d (%s: %s)", se.HTTPStatusCode, status, se.Type, se.Msg)
	}
	return se
}

func newChargeParams(customer string, amount int64, key string) *stripe.ChargeParams {
	p := &stripe.ChargeParams{
		Amount:      stripe.Int64(amount),
		Currency:    stripe.String("usd"),
		Customer:    stripe.String(customer),
		Description: stripe.String("Usage billing for 2024-04"),
	}
	p.AddMetadata("customer_id", "c-"+customer)
	p.AddMetadata("billing_period", "2024-04")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}
