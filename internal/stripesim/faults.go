package stripesim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Faults are the failures the emulator injects. The zero value injects none.
// Set them in Config.Faults, change them with Server.SetFaults or POST
// /_sim/faults. Every random decision draws from one math/rand source seeded
// by Config.Seed.
type Faults struct {
	// Latency delays every /v1 request after its idempotency key is claimed,
	// so a concurrent retry with the same key sees 409 idempotency_key_in_use.
	Latency Latency
	// PageLatency adds a delay to each list call of a path, e.g.
	// {"/v1/charges": 100 * time.Millisecond}, to simulate slow pagination.
	PageLatency map[string]time.Duration

	// ErrorRate is the fraction of /v1 requests answered 500 api_error
	// before executing (never stored under the idempotency key).
	ErrorRate float64
	// ErrorShouldRetry adds "Stripe-Should-Retry: true" to injected 500s,
	// which makes stripe-go retry even POSTs when MaxNetworkRetries > 0.
	ErrorShouldRetry bool
	// RateLimitedRate is the fraction of /v1 requests answered 429
	// rate_limit before executing, independent of RateLimit.
	RateLimitedRate float64
	// RateLimit caps /v1 requests per second (token bucket, real time);
	// excess requests get 429 rate_limit. 0 means unlimited.
	RateLimit float64
	// RateBurst is the bucket size; defaults to max(1, RateLimit).
	RateBurst int

	// DeclineCustomers are Stripe customer ids whose charges fail with 402
	// card_error/card_declined/generic_decline. The failed charge is stored
	// with status "failed", as Stripe does.
	DeclineCustomers []string
	// DeclineCodes maps a customer (or payment method) id to the
	// decline_code its card charges fail with: a 402 card_error
	// card_declined carrying that decline_code, and a failed charge whose
	// outcome.reason is it. SoftDeclineCodes and HardDeclineCodes list the
	// codes pelguard tells apart. It wins over DeclineCustomers.
	DeclineCodes map[string]string
	// CardErrorCodes maps a customer (or payment method) id to the code of
	// a card_error Stripe sends WITHOUT a decline_code, as its test cards
	// do: processing_error (4000000000000119, PMProcessingError),
	// expired_card (…0069), incorrect_cvc (…0127). The charge fails with
	// that failure_code. DeclineCodes wins over it.
	CardErrorCodes map[string]string
	// AdviceCodes maps a customer (or payment method) id to the issuer's
	// advice_code on its declines (do_not_try_again, try_again_later,
	// confirm_card_data): on the 402 error, the intent's
	// last_payment_error and the charge's outcome, as Stripe sends it.
	AdviceCodes map[string]string
	// DebitCustomers are customer or payment-method ids paying by bank debit
	// (ACH, SEPA, Bacs): a confirmed PaymentIntent ends the create call
	// "processing" with a "pending" charge, a charge create answers a
	// "pending" charge, and nothing is final until Settle.
	DebitCustomers []string
	// AuthRequiredCustomers are customer or payment-method ids whose bank
	// asks for authentication (3-D Secure). See createIntent for what an
	// off-session and an on-session confirm then answer.
	AuthRequiredCustomers []string
	// NoPaymentMethodCustomers are customer ids with no usable payment
	// method: a confirm without payment_method fails 400 and leaves the
	// intent "requires_payment_method"; a charge create fails 400 missing.
	NoPaymentMethodCustomers []string

	// DropRate is the fraction of successful charge creates (POST
	// /v1/charges, confirmed POST /v1/payment_intents) whose connection is
	// closed after the charge is committed and its idempotent response
	// recorded, before any byte of reply: "charge committed, response lost".
	DropRate float64
	// DropNextCharges drops the next N successful charge creates, then stops.
	// Faults() reports how many remain.
	DropNextCharges int
	// DropHang holds a dropped connection open until the client gives up
	// (its timeout or context) instead of closing it at once. Go's transport
	// silently retries an Idempotency-Key POST when a reused keep-alive
	// connection is closed without a reply; a hang is never retried by the
	// transport, so it models a client timeout faithfully.
	DropHang bool

	// FailNextRefunds answers the next N POST /v1/refunds with 500
	// api_error before they execute (nothing refunded, nothing cached under
	// the key), then stops: a transient refund failure. Faults() reports
	// how many remain.
	FailNextRefunds int

	// MeterEventLatency is how long each POST /v1/billing/meter_events is
	// in flight once it holds its customer-and-meter slot: a second call
	// for the same customer and meter meanwhile gets Stripe's 429 (see
	// meterevents.go). Latency applies before it, outside the slot. The
	// event is recorded when it ends, even if the client has gone: a
	// client timeout shorter than it is "recorded, response lost".
	MeterEventLatency time.Duration
	// MeterEventRateLimit caps POST /v1/billing/meter_events per second
	// (token bucket, real time), Stripe's limit of its own for meter
	// events (1,000/s in live mode); excess calls get 429 rate_limit.
	// Live-mode keys' meter events do not count against RateLimit, test
	// keys' do, as Stripe counts them. 0 means unlimited.
	MeterEventRateLimit float64
	// MeterEventRateBurst is its bucket size; defaults to
	// max(1, MeterEventRateLimit).
	MeterEventRateBurst int
	// DropNextMeterEvents drops the connection of the next N recorded
	// meter events after recording them (and their idempotent response),
	// before any byte of reply: "recorded, response lost". DropHang
	// applies. Faults() reports how many remain.
	DropNextMeterEvents int
	// RejectNextMeterEvents answers the next N valid meter events 200 and
	// then drops them, recording an error report instead (code
	// "stripesim_injected"): Stripe validates part of an event after its
	// 200 and reports what it rejects in v1.billing.meter.error_report_triggered
	// events. Faults() reports how many remain.
	RejectNextMeterEvents int
	// MeterSummaryLag makes meter event summaries eventually consistent,
	// as Stripe's are (documented: "aggregated usage in meter event
	// summaries … might not immediately reflect recently received meter
	// events"): an event counts in a summary only once it was received at
	// least this long ago on the emulator's clock (Advance moves it).
	// MeterTotal and MeterEvents are not delayed. 0: immediate.
	MeterSummaryLag time.Duration
}

// Latency describes injected delay: Fixed + uniform[Min, Max) + Tail with
// probability TailProb.
type Latency struct {
	Fixed    time.Duration
	Min, Max time.Duration
	TailProb float64
	Tail     time.Duration
}

// Validate reports nonsensical fault settings, each named as POST
// /_sim/faults spells it (error_rate, latency.tail_prob): that is where
// someone types them.
func (f Faults) Validate() error {
	var errs []error
	for _, p := range []struct {
		name string
		v    float64
	}{{"error_rate", f.ErrorRate}, {"rate_limited_rate", f.RateLimitedRate}, {"drop_rate", f.DropRate}, {"latency.tail_prob", f.Latency.TailProb}} {
		if p.v < 0 || p.v > 1 {
			errs = append(errs, fmt.Errorf("%s %v: want a fraction from 0 to 1", p.name, p.v))
		}
	}
	for _, n := range []struct {
		name string
		v    float64
	}{{"rate_limit", f.RateLimit}, {"rate_burst", float64(f.RateBurst)}, {"drop_next_charges", float64(f.DropNextCharges)},
		{"fail_next_refunds", float64(f.FailNextRefunds)}, {"meter_event_latency", float64(f.MeterEventLatency)},
		{"meter_event_rate_limit", f.MeterEventRateLimit}, {"meter_event_rate_burst", float64(f.MeterEventRateBurst)},
		{"drop_next_meter_events", float64(f.DropNextMeterEvents)}, {"reject_next_meter_events", float64(f.RejectNextMeterEvents)},
		{"meter_summary_lag", float64(f.MeterSummaryLag)}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s: want 0 or more", n.name))
		}
	}
	for id, code := range f.DeclineCodes {
		if code == "" {
			errs = append(errs, fmt.Errorf("decline_codes[%q] is empty: want a decline code (card_declined, insufficient_funds, …)", id))
		}
	}
	for id, code := range f.CardErrorCodes {
		if code == "" {
			errs = append(errs, fmt.Errorf("card_error_codes[%q] is empty: want a card error code", id))
		}
	}
	for id, code := range f.AdviceCodes {
		if !slices.Contains(AdviceCodes, code) {
			errs = append(errs, fmt.Errorf("advice_codes[%q] is %q: want one of %v", id, code, AdviceCodes))
		}
	}
	l := f.Latency
	if l.Fixed < 0 || l.Min < 0 || l.Max < l.Min || l.Tail < 0 {
		errs = append(errs, fmt.Errorf("latency (fixed %s, min %s, max %s, tail %s): want durations of 0 or more and max at least min", l.Fixed, l.Min, l.Max, l.Tail))
	}
	return errors.Join(errs...)
}

// activeFaults is an immutable snapshot, swapped atomically so the hot path
// reads faults without a lock.
type activeFaults struct {
	Faults
	declines     map[string]bool
	debits       map[string]bool
	authRequired map[string]bool
	noPM         map[string]bool
	limiter      *rate.Limiter
	meterLimiter *rate.Limiter
}

type faultState struct {
	cur      atomic.Pointer[activeFaults]
	dropNext atomic.Int64
	failRef  atomic.Int64
	// dropMeter and rejectMeter count down DropNextMeterEvents and
	// RejectNextMeterEvents.
	dropMeter   atomic.Int64
	rejectMeter atomic.Int64
	rngMu       sync.Mutex
	rng         *rand.Rand
}

func (fs *faultState) init(seed int64, f Faults) {
	fs.rng = rand.New(rand.NewSource(seed))
	fs.set(f)
}

func (fs *faultState) set(f Faults) {
	a := &activeFaults{Faults: f, declines: setOf(f.DeclineCustomers), debits: setOf(f.DebitCustomers),
		authRequired: setOf(f.AuthRequiredCustomers), noPM: setOf(f.NoPaymentMethodCustomers)}
	if f.RateLimit > 0 {
		burst := f.RateBurst
		if burst == 0 {
			burst = max(1, int(f.RateLimit))
		}
		a.limiter = rate.NewLimiter(rate.Limit(f.RateLimit), burst)
	}
	if f.MeterEventRateLimit > 0 {
		burst := f.MeterEventRateBurst
		if burst == 0 {
			burst = max(1, int(f.MeterEventRateLimit))
		}
		a.meterLimiter = rate.NewLimiter(rate.Limit(f.MeterEventRateLimit), burst)
	}
	fs.dropNext.Store(int64(f.DropNextCharges))
	fs.failRef.Store(int64(f.FailNextRefunds))
	fs.dropMeter.Store(int64(f.DropNextMeterEvents))
	fs.rejectMeter.Store(int64(f.RejectNextMeterEvents))
	fs.cur.Store(a)
}

func (fs *faultState) current() *activeFaults { return fs.cur.Load() }

// chance draws one decision with probability p; p == 0 never touches the
// shared source so fault-free runs do not contend on its lock.
func (fs *faultState) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	fs.rngMu.Lock()
	defer fs.rngMu.Unlock()
	return fs.rng.Float64() < p
}

func (fs *faultState) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	fs.rngMu.Lock()
	defer fs.rngMu.Unlock()
	return lo + time.Duration(fs.rng.Int63n(int64(hi-lo)))
}

func (fs *faultState) shouldDrop() bool {
	return takeOne(&fs.dropNext) || fs.chance(fs.current().DropRate)
}

// takeOne decrements n if it is positive and reports whether it did.
func takeOne(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// SetFaults replaces the active faults. DropNextCharges restarts its count.
func (s *Server) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("stripesim: %w", err)
	}
	s.faults.set(f)
	return nil
}

// Faults returns the active faults, with DropNextCharges set to the number of
// drops still pending.
func (s *Server) Faults() Faults {
	f := s.faults.current().Faults
	f.DropNextCharges = int(max(0, s.faults.dropNext.Load()))
	f.FailNextRefunds = int(max(0, s.faults.failRef.Load()))
	f.DropNextMeterEvents = int(max(0, s.faults.dropMeter.Load()))
	f.RejectNextMeterEvents = int(max(0, s.faults.rejectMeter.Load()))
	return f
}

// injectPreExecution applies the rate limits and the injected 500/429
// faults, which all answer before the request executes. A meter event
// (POST /v1/billing/meter_events) draws on MeterEventRateLimit and, made
// with a test key, on RateLimit too: Stripe gives live-mode meter events a
// limit of their own outside the basic one, and counts test-mode ones
// against the basic limit (docs.stripe.com/rate-limits).
func (s *Server) injectPreExecution(r *http.Request, livemode bool) (response, bool) {
	f := s.faults.current()
	meterEvent := r.Method == http.MethodPost && r.URL.Path == meterEventsPath
	if f.limiter != nil && !(meterEvent && livemode) && !f.limiter.Allow() {
		s.log.Info("stripesim: rate limited", slog.String("path", r.URL.Path))
		if meterEvent {
			s.meters.count(func(c *MeterEventCounts) { c.RateLimited++ })
		}
		return rateLimited(), false
	}
	if meterEvent && f.meterLimiter != nil && !f.meterLimiter.Allow() {
		s.log.Info("stripesim: meter events rate limited", slog.String("path", r.URL.Path))
		s.meters.count(func(c *MeterEventCounts) { c.RateLimited++ })
		return rateLimited(), false
	}
	refundPOST := r.Method == http.MethodPost && r.URL.Path == "/v1/refunds"
	if s.faults.chance(f.ErrorRate) || (refundPOST && takeOne(&s.faults.failRef)) {
		s.log.Info("stripesim: injecting 500", slog.String("path", r.URL.Path))
		resp := errorResp(http.StatusInternalServerError, stripeError{
			Type: "api_error", Message: "An unknown error occurred (injected by stripesim).",
		})
		if f.ErrorShouldRetry {
			resp.shouldRetry = "true"
		}
		return resp, false
	}
	if s.faults.chance(f.RateLimitedRate) {
		s.log.Info("stripesim: injecting 429", slog.String("path", r.URL.Path))
		return rateLimited(), false
	}
	return response{}, true
}

func rateLimited() response {
	return errorResp(http.StatusTooManyRequests, stripeError{
		Type: "invalid_request_error", Code: "rate_limit",
		Message: "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests.",
	})
}

// sleepLatency applies Latency and PageLatency, waking early when the client
// goes away or the server closes.
func (s *Server) sleepLatency(r *http.Request, rt routeInfo) {
	f := s.faults.current()
	l := f.Latency
	d := l.Fixed + s.faults.uniform(l.Min, l.Max)
	if l.Tail > 0 && s.faults.chance(l.TailProb) {
		d += l.Tail
	}
	if rt.list {
		d += f.PageLatency[r.URL.Path]
	}
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-s.closing:
	}
}

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
