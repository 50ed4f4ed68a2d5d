// Package stripeapi is the one package in pelguard that calls stripe-go. It
// owns the client setup (no global stripe.Key), the shared rate limit, the
// PaymentIntent/Charges choice, and the translation of every stripe-go and
// transport error into a small set of kinds (see classify).
package stripeapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
	"golang.org/x/time/rate"
)

// Mode selects the Stripe API used to create charges.
type Mode string

const (
	// ModePaymentIntents creates a PaymentIntent with confirm=true,
	// off_session=true and reports its latest charge. The default.
	ModePaymentIntents Mode = "payment_intents"
	// ModeCharges uses the legacy Charges API, as the seed code does.
	ModeCharges Mode = "charges"
)

// ErrUnrestrictedKey is New's answer to an sk_live_ key without
// Config.AllowUnrestrictedKey.
var ErrUnrestrictedKey = errors.New("stripeapi: refusing an unrestricted live key (sk_live_…): create a restricted key (rk_live_…) with only the permissions this program needs, or allow it explicitly (--allow-unrestricted-key)")

// NoRetries is the MaxNetworkRetries value that disables stripe-go's retries.
const NoRetries int64 = -1

// RetriesFromFlag maps a user's retry count (0 = none) to MaxNetworkRetries
// (0 = default).
func RetriesFromFlag(n int) int64 {
	if n <= 0 {
		return NoRetries
	}
	return int64(n)
}

// Defaults applied by New.
const (
	DefaultMaxNetworkRetries int64 = 2
	DefaultTimeout                 = 30 * time.Second
	// listPageSize is Stripe's maximum page size; fewer round trips per audit.
	listPageSize = 100
)

// Config configures a Client. Only APIKey is required.
type Config struct {
	// APIKey is the secret (sk_) or restricted (rk_) key. It is never
	// logged and never appears in errors. An unrestricted live key
	// (sk_live_) is refused with ErrUnrestrictedKey unless
	// AllowUnrestrictedKey: a restricted rk_live_ key with only the
	// permissions the program needs limits what a leaked key can do.
	APIKey string
	// AllowUnrestrictedKey accepts an sk_live_ key (Logger gets a warning).
	AllowUnrestrictedKey bool
	// BaseURL overrides the API base (STRIPE_API_BASE), e.g. the emulator or
	// stripe-mock. Empty means real Stripe.
	BaseURL string
	// Mode selects PaymentIntents (default) or the Charges API.
	Mode Mode
	// MaxNetworkRetries is stripe-go's own retry count; its retries reuse the
	// same Idempotency-Key. 0 means the default (DefaultMaxNetworkRetries,
	// 2); -1 (not 0) disables retries, as in go-redis. A CLI flag where the
	// user types 0 for "no retries" passes -1 (see NoRetries).
	MaxNetworkRetries int64
	// Timeout bounds each HTTP attempt (not the whole call). Default 30s.
	Timeout time.Duration
	// HTTPClient is optional; its transport is wrapped, never mutated.
	HTTPClient *http.Client
	// RateLimit is the requests/second shared by every caller of this Client
	// (every attempt and every list page counts). 0 means unlimited.
	RateLimit float64
	// Burst is the limiter's burst; default max(1, ceil(RateLimit)).
	Burst int
	// Limiter, when set, paces every attempt instead of RateLimit: a limit
	// shared with other processes (package stripelimit shares the account's
	// rate through Redis). It is told about every 429, so it can slow the
	// fleet. Setting both Limiter and RateLimit is an error.
	Limiter Limiter
	// MeterLimiter, when set, paces meter events (POST
	// /v1/billing/meter_events, SendMeterEvent's calls) instead of Limiter
	// or RateLimit, and is told about their 429s. Stripe gives live-mode
	// meter events a limit of their own, 1,000 calls/s per account outside
	// the basic 100/s (docs.stripe.com/rate-limits): a live fleet passes a
	// limiter of that schedule (stripelimit.Config.ForMeterEvents). In test
	// mode meter events count against the basic limit: leave it nil and
	// they share Limiter (or RateLimit) like every other call. Adjustments
	// (CancelMeterEvent) are ordinary calls and always use the general one.
	MeterLimiter Limiter
	// ResolvePaymentMethod makes Charge (payment_intents mode) look up the
	// customer's invoice_settings.default_payment_method (or default_source)
	// and pass it to the intent: one extra GET per charge. Real Stripe needs
	// it, so it is forced on when BaseURL is empty; the emulator and
	// stripe-mock accept an intent without a payment method.
	ResolvePaymentMethod bool
	// Logger receives stripe-go's own log lines (scrubbed, at debug/warn).
	// nil means silent.
	Logger *slog.Logger
	// Observe, if set, is called once per adapter operation ("charge",
	// "find_charge", "list_charges", "refund") with its duration and
	// classified error, so callers can feed metrics without this package
	// depending on Prometheus.
	Observe func(op string, d time.Duration, err error)
}

// Limiter paces Stripe requests beyond this process: Wait is called before
// every HTTP attempt (stripe-go's retries and every list page included) with
// the attempt's endpoint (see Endpoint), RateLimited after every 429.
type Limiter interface {
	// Wait blocks until one request to endpoint may be sent; it returns
	// ctx's error if ctx ends first.
	Wait(ctx context.Context, endpoint string) error
	// RateLimited reports a 429 from Stripe for endpoint.
	RateLimited(ctx context.Context, endpoint string)
}

// Endpoint names a request the way Stripe counts its per-endpoint limits:
// the method and the path with object ids replaced ("GET /v1/charges/{id}"),
// so every charge's GET counts against one endpoint. A namespace is part of
// the resource's name: "POST /v1/billing/meter_events",
// "GET /v1/billing/meters/{id}/event_summaries".
func Endpoint(method, path string) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	first := 2
	if len(segs) > 2 && namespaces[segs[1]] {
		first = 3
	}
	for i := first; i < len(segs); i += 2 {
		if segs[i] != "search" {
			segs[i] = "{id}"
		}
	}
	return method + " /" + strings.Join(segs, "/")
}

// namespaces are the path segments Stripe puts before a resource's name
// (/v1/billing/meters, /v1/checkout/sessions).
var namespaces = map[string]bool{
	"apps": true, "billing": true, "billing_portal": true, "checkout": true, "climate": true,
	"entitlements": true, "financial_connections": true, "forwarding": true, "identity": true,
	"issuing": true, "radar": true, "reporting": true, "sigma": true, "tax": true,
	"terminal": true, "test_helpers": true, "treasury": true,
}

// meterEventsPath is the one endpoint MeterLimiter paces.
const meterEventsPath = "/v1/billing/meter_events"

// Client is safe for concurrent use; share one per process so the rate
// limit is shared.
type Client struct {
	api       *client.API
	backend   stripe.Backend // for the lean list decoding (list.go)
	key       string
	mode      Mode
	resolvePM bool
	observe   func(op string, d time.Duration, err error)
	logger    *slog.Logger
	limiter   *rate.Limiter
}

// New validates cfg and builds a Client. Errors never contain the key.
func New(cfg Config) (*Client, error) {
	if strings.TrimSpace(cfg.APIKey) == "" {
		return nil, errors.New("stripeapi: APIKey is required")
	}
	if strings.ContainsAny(cfg.APIKey, " \t\r\n") {
		return nil, errors.New("stripeapi: APIKey contains whitespace")
	}
	if strings.HasPrefix(cfg.APIKey, "sk_live_") {
		if !cfg.AllowUnrestrictedKey {
			return nil, ErrUnrestrictedKey
		}
		if cfg.Logger != nil {
			cfg.Logger.Warn("using an unrestricted live Stripe key (AllowUnrestrictedKey); a restricted rk_ key limits the damage of a leak")
		}
	}
	cfg.Mode = cmp.Or(cfg.Mode, ModePaymentIntents)
	if cfg.Mode != ModePaymentIntents && cfg.Mode != ModeCharges {
		return nil, fmt.Errorf("stripeapi: unknown mode %q (want %q or %q)", cfg.Mode, ModePaymentIntents, ModeCharges)
	}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("stripeapi: BaseURL %q must be an absolute http(s) URL", scrub(cfg.BaseURL))
		}
	} else {
		cfg.ResolvePaymentMethod = true
	}
	if cfg.MaxNetworkRetries == 0 {
		cfg.MaxNetworkRetries = DefaultMaxNetworkRetries
	} else if cfg.MaxNetworkRetries < 0 {
		cfg.MaxNetworkRetries = 0
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("stripeapi: negative Timeout %s", cfg.Timeout)
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	if cfg.RateLimit < 0 {
		return nil, fmt.Errorf("stripeapi: negative RateLimit %v", cfg.RateLimit)
	}
	if cfg.Burst < 0 {
		return nil, fmt.Errorf("stripeapi: negative Burst %d", cfg.Burst)
	}
	if cfg.Limiter != nil && cfg.RateLimit > 0 {
		return nil, errors.New("stripeapi: both Limiter and RateLimit set: the Limiter paces every request; drop RateLimit")
	}

	c := &Client{
		mode:      cfg.Mode,
		resolvePM: cfg.ResolvePaymentMethod,
		observe:   cfg.Observe,
		logger:    cfg.Logger,
	}
	if cfg.RateLimit > 0 {
		burst := cfg.Burst
		if burst == 0 {
			burst = max(1, int(cfg.RateLimit+0.999))
		}
		c.limiter = rate.NewLimiter(rate.Limit(cfg.RateLimit), burst)
	}

	httpClient := buildHTTPClient(cfg.HTTPClient, cfg.Timeout, c.limiter, cfg.Limiter, cfg.MeterLimiter)
	var leveled stripe.LeveledLoggerInterface = &stripe.LeveledLogger{Level: stripe.LevelNull}
	if cfg.Logger != nil {
		leveled = &slogLeveled{l: cfg.Logger, key: cfg.APIKey}
	}
	bc := &stripe.BackendConfig{
		HTTPClient:        httpClient,
		MaxNetworkRetries: stripe.Int64(cfg.MaxNetworkRetries),
		LeveledLogger:     leveled,
		EnableTelemetry:   stripe.Bool(false),
	}
	if cfg.BaseURL != "" {
		bc.URL = stripe.String(strings.TrimRight(cfg.BaseURL, "/"))
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, bc)
	// Connect and Uploads are never used; pointing them at the same backend
	// keeps client.New from falling back to the package-level globals.
	c.api = client.New(cfg.APIKey, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
	c.backend, c.key = backend, cfg.APIKey
	return c, nil
}

// buildHTTPClient returns a client whose transport applies the shared rate
// limit to every attempt (meter's to meter events, when set) and records
// each response status, without modifying the caller's client.
func buildHTTPClient(base *http.Client, timeout time.Duration, limiter *rate.Limiter, shared, meter Limiter) *http.Client {
	var hc http.Client
	var rt http.RoundTripper
	if base != nil {
		hc = *base
		rt = base.Transport
	}
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Many workers talk to one host: the default of 2 idle connections
		// per host would make most requests open a new connection.
		t.MaxIdleConns = 256
		t.MaxIdleConnsPerHost = 256
		rt = t
	}
	if hc.Timeout == 0 {
		hc.Timeout = timeout
	}
	hc.Transport = &transport{next: rt, limiter: limiter, shared: shared, meter: meter}
	return &hc
}

type statusKey struct{}

// statusBox receives the HTTP status of the latest attempt of one call.
type statusBox struct{ status int }

// transport waits on the shared limiter before each attempt (stripe-go's
// retries and each list page included) and notes the response status for
// classify.
type transport struct {
	next    http.RoundTripper
	limiter *rate.Limiter
	shared  Limiter
	meter   Limiter // meter events only, when set
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var endpoint string
	limiter, shared := t.limiter, t.shared
	if t.meter != nil && req.Method == http.MethodPost && req.URL.Path == meterEventsPath {
		limiter, shared = nil, t.meter
	}
	if limiter != nil || shared != nil {
		wait := limiter.Wait
		if shared != nil {
			endpoint = Endpoint(req.Method, req.URL.Path)
			wait = func(ctx context.Context) error { return shared.Wait(ctx, endpoint) }
		}
		if err := wait(req.Context()); err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("waiting for rate limit: %w", err)
		}
	}
	resp, err := t.next.RoundTrip(req)
	if resp != nil {
		if box, ok := req.Context().Value(statusKey{}).(*statusBox); ok {
			box.status = resp.StatusCode
		}
		if resp.StatusCode == http.StatusTooManyRequests && shared != nil {
			shared.RateLimited(req.Context(), endpoint)
		}
	}
	return resp, err
}

// call runs fn with a context that collects the HTTP status, classifies its
// error, and reports to Observe.
func (c *Client) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return ctxError(ctx, op)
	}
	box := &statusBox{}
	start := time.Now()
	err := fn(context.WithValue(ctx, statusKey{}, box))
	if err != nil {
		switch {
		case ctx.Err() != nil:
			// The caller gave up: whatever the transport said, report the
			// cancellation itself.
			err = ctxError(ctx, op)
		default:
			var se *stripe.Error
			var ae *Error
			if !errors.As(err, &se) && !errors.As(err, &ae) && box.status >= 300 {
				err = &statusError{status: box.status, err: err}
			}
			err = classify(err)
		}
	}
	if c.observe != nil {
		c.observe(op, time.Since(start), err)
	}
	return err
}

// slogLeveled adapts stripe-go's printf logger to slog. stripe-go's Info
// lines are per-request chatter, so they go to Debug. Of its Error lines,
// the two that repeat an error the adapter returns ("Request error from
// Stripe (status N): …", "Request failed with error: …") go to Debug too:
// the caller classifies that error and says what it means once (a missing
// meter is one meter_missing line, not a stripe-go warning per refused
// event). What stripe-go alone knows stays a warning: a retry it is about
// to make, a response it could not decode. Every line is scrubbed.
type slogLeveled struct {
	l   *slog.Logger
	key string
}

func (s *slogLeveled) msg(format string, v ...any) string {
	m := scrub(fmt.Sprintf(format, v...))
	if s.key != "" {
		m = strings.ReplaceAll(m, s.key, "[REDACTED]")
	}
	return m
}

// log formats and scrubs a line only when the logger takes its level:
// stripe-go logs every request at Info, and the scrub's patterns cost more
// than the rest of a meter event's client-side work.
func (s *slogLeveled) log(level slog.Level, format string, v ...any) {
	if s.l.Enabled(context.Background(), level) {
		s.l.Log(context.Background(), level, s.msg(format, v...), slog.String("component", "stripe-go"))
	}
}

func (s *slogLeveled) Debugf(format string, v ...any) { s.log(slog.LevelDebug, format, v...) }
func (s *slogLeveled) Infof(format string, v ...any)  { s.log(slog.LevelDebug, format, v...) }
func (s *slogLeveled) Warnf(format string, v ...any)  { s.log(slog.LevelWarn, format, v...) }
func (s *slogLeveled) Errorf(format string, v ...any) {
	level := slog.LevelWarn
	if strings.HasPrefix(format, "Request error from Stripe") || strings.HasPrefix(format, "Request failed with error") {
		level = slog.LevelDebug // returned as the call's error, and logged by its caller
	}
	s.log(level, format, v...)
}

// Metadata keys of the pelguard convention (DESIGN.md).
const (
	MetaCustomerID     = "customer_id"
	MetaBillingPeriod  = "billing_period"
	MetaIdempotencyKey = "idempotency_key"
	MetaMarker         = "pelguard"
)

// PelguardMetadata returns the metadata every pelguard charge carries, so
// the auditor can match Stripe to the ledger without guessing.
func PelguardMetadata(customerID, period, key string) map[string]string {
	return map[string]string{
		MetaCustomerID:     customerID,
		MetaBillingPeriod:  period,
		MetaIdempotencyKey: key,
		MetaMarker:         "1",
	}
}

// IsPelguard reports whether md carries the pelguard marker.
func IsPelguard(md map[string]string) bool {
	return md[MetaMarker] == "1"
}
