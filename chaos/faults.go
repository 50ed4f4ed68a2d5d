package chaos

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// faults is an http.RoundTripper in front of the emulator that makes
// chosen customers' charge requests (or chosen meter events, keyed by
// meterFaultKey) slow or loses their replies. Faults are
// chosen per Stripe customer rather than through the emulator's global fault
// switches, so a concurrent request of another consumer (the monitor's, the
// reaper's) can never take a fault meant for this one: the same events meet
// the same faults in both modes.
type faults struct {
	next http.RoundTripper
	// slow customers' charge requests wait delay before reaching Stripe:
	// "reclaim while in flight" needs a call that outlives min-idle.
	slow  map[string]bool
	delay time.Duration
	// lose customers' first charge is committed at Stripe and its reply
	// thrown away, after hang: "charge committed, response lost", the
	// client-side timeout of "partial batch" and "expired key".
	lose map[string]bool
	hang time.Duration

	mu   sync.Mutex
	lost map[string]bool
}

// timeoutError is what the client sees when a reply is lost: a network
// timeout, which the Stripe adapter classifies as transient.
type timeoutError struct{}

func (timeoutError) Error() string   { return "chaos: Stripe reply lost (client timeout)" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// RoundTrip implements http.RoundTripper.
func (f *faults) RoundTrip(r *http.Request) (*http.Response, error) {
	next := f.next
	if next == nil {
		next = http.DefaultTransport
	}
	cust, r, err := faultKey(r)
	if err != nil || cust == "" {
		if err != nil {
			return nil, err
		}
		return next.RoundTrip(r)
	}
	if f.slow[cust] {
		if err := sleep(r.Context(), f.delay); err != nil {
			return nil, err
		}
	}
	resp, err := next.RoundTrip(r)
	if err != nil || !f.lose[cust] || resp.StatusCode >= 300 {
		return resp, err
	}
	f.mu.Lock()
	first := !f.lost[cust]
	if f.lost == nil {
		f.lost = map[string]bool{}
	}
	f.lost[cust] = true
	f.mu.Unlock()
	if !first {
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err := sleep(r.Context(), f.hang); err != nil {
		return nil, err
	}
	return nil, timeoutError{}
}

// faultKey returns the fault key of a charge-creating POST (/v1/charges or
// /v1/payment_intents: its Stripe customer) or of a meter event (POST
// /v1/billing/meter_events: meterFaultKey), and a request whose body can
// still be read; "" for any other request.
func faultKey(r *http.Request) (string, *http.Request, error) {
	meter := strings.HasSuffix(r.URL.Path, "/v1/billing/meter_events")
	if r.Method != http.MethodPost || r.Body == nil ||
		(!meter && !strings.HasSuffix(r.URL.Path, "/v1/charges") && !strings.HasSuffix(r.URL.Path, "/v1/payment_intents")) {
		return "", r, nil
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return "", r, err
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return "", r2, nil
	}
	if meter {
		return form.Get("payload[stripe_customer_id]") + "@" + form.Get("timestamp"), r2, nil
	}
	return form.Get("customer"), r2, nil
}

// meterFaultKey is a meter event's fault key: its customer and timestamp
// (unix seconds, as sent), which the drill makes unique per event. Not the
// identifier: the naive sender has none.
func meterFaultKey(customer string, ts time.Time) string {
	return customer + "@" + strconv.FormatInt(ts.Unix(), 10)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
