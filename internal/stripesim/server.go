// Package stripesim is a stateful, in-process Stripe emulator that
// github.com/stripe/stripe-go/v76 talks to through stripe.BackendConfig.URL.
//
// It keeps customers, charges, payment intents, refunds and billing meters
// (meters, meter events, adjustments, event summaries: meters.go) in
// memory, honours Idempotency-Key like Stripe (24 h window on a
// controllable clock), checks restricted-key permissions, and injects the
// faults pelguard must survive: latency, 500s, 429s, declines and "charge
// committed, response lost".
//
// Request pipeline, in order (the order decides what gets cached):
//
//	route → count → auth (401) → permission (403) → rate limit / injected
//	500 / injected 429 → idempotency claim → latency → execute → record
//	idempotent response → reply, or commit-then-drop.
//
// Injected 500s and 429s happen before execution, so like Stripe's own
// pre-execution failures they are never stored under the idempotency key and
// a retry with the same key executes for real.
package stripesim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"github.com/pelguard/pelguard/clock"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultAddr is where New listens when Config.Addr is empty: loopback on an
// ephemeral port, so parallel tests never collide.
const DefaultAddr = "127.0.0.1:0"

// IdempotencyWindow is how long a recorded idempotent response is replayed,
// measured on the emulator's clock.
const IdempotencyWindow = 24 * time.Hour

// Config configures a Server. The zero value is usable.
type Config struct {
	// Addr is the listen address; DefaultAddr when empty.
	Addr string
	// Seed seeds the math/rand source behind every fault decision, so a run
	// with the same seed and the same request order injects the same faults.
	Seed int64
	// Now freezes the clock at this instant; it then moves only through
	// Advance and SetNow. When zero the clock follows wall time (plus any
	// Advance/SetNow offset), which is what the drill wants.
	Now time.Time
	// Faults are the faults active from the first request.
	Faults Faults
	// Logger receives one line per injected fault; discarded when nil.
	Logger *slog.Logger
	// ChargeOmitsIntentMetadata makes charges created by a PaymentIntent carry
	// no metadata or description. Real Stripe copies them; this knob exists so
	// the auditor's "expand payment_intent" fallback can be exercised.
	ChargeOmitsIntentMetadata bool
	// RequireCustomers rejects charges and intents naming a customer that was
	// never created (404-like 400 resource_missing, as Stripe does). Off by
	// default so tests may use arbitrary cus_ ids.
	RequireCustomers bool
	// OnExecute, when set, runs for every POST after its idempotency claim
	// and the injected latency, just before the endpoint executes, with the
	// endpoint's kind ("charge", "payment_intent", "refund", …). It is a
	// signal for tests: "a request now holds its key", instead of a sleep.
	OnExecute func(kind string)
	// Webhook, when its URL is set, receives every event, signed with its
	// Secret; SetWebhook changes it later.
	Webhook Webhook
	// OnMeterEventInFlight, when set, runs for every meter event while it
	// holds its customer-and-meter slot (see meterevents.go), before it is
	// recorded: a test holds it there to provoke Stripe's one-call-per-
	// customer-per-meter rule without a sleep.
	OnMeterEventInFlight func(customer, eventName string)
}

// Server is a running emulator. All methods are safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	ln     net.Listener
	http   *http.Server
	url    string
	clock  *clock.Sim
	store  *store
	meters *meterStore
	idem   *idemStore
	faults faultState
	perms  sync.Map // restricted key → map[string]bool

	requestSeq    atomic.Uint64
	chargeCreates atomic.Int64
	countsMu      sync.Mutex
	counts        map[string]int64

	closing   chan struct{}
	closeOnce sync.Once
	hungMu    sync.Mutex
	hung      map[net.Conn]struct{}

	events         *eventLog
	webhook        atomic.Pointer[Webhook]
	webhookClient  *http.Client
	webhookTr      *http.Transport
	stopDeliveries context.CancelFunc
	deliveriesDone chan struct{}

	// testHookExecute, when set, runs after the idempotency claim and the
	// latency, just before the endpoint executes. Tests use it to hold a
	// request "in flight" deterministically instead of sleeping.
	testHookExecute func(kind string)
}

// New starts an emulator listening on cfg.Addr. It returns an error only when
// the listener cannot be opened or the faults are invalid.
func New(cfg Config) (*Server, error) {
	cfg.Addr = cmp.Or(cfg.Addr, DefaultAddr)
	if err := cfg.Faults.Validate(); err != nil {
		return nil, fmt.Errorf("stripesim: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("stripesim: listening on %s: %w", cfg.Addr, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:     cfg,
		log:     log,
		ln:      ln,
		url:     "http://" + ln.Addr().String(),
		clock:   newClock(cfg.Now),
		store:   newStore(),
		meters:  newMeterStore(),
		idem:    newIdemStore(),
		counts:  make(map[string]int64),
		closing: make(chan struct{}),
		hung:    make(map[net.Conn]struct{}),
		events:  newEventLog(),
	}
	s.faults.init(cfg.Seed, cfg.Faults)
	s.SetWebhook(cfg.Webhook)
	s.webhookTr = &http.Transport{MaxIdleConnsPerHost: 4}
	s.webhookClient = &http.Client{Transport: s.webhookTr, Timeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopDeliveries, s.deliveriesDone = cancel, make(chan struct{})
	go s.runDeliveries(ctx)
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.http.Serve(ln) }()
	return s, nil
}

// MustNew is New for tests and benchmarks: it panics on error.
func MustNew(cfg Config) *Server {
	s, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return s
}

// URL is the base URL to give stripe.BackendConfig.URL, e.g.
// "http://127.0.0.1:40123" (stripe-go appends /v1/...).
func (s *Server) URL() string { return s.url }

// Close stops the listener, drops every connection (including ones held by
// the DropHang fault), wakes requests sleeping in injected latency and
// forgets every stored object: inspect before closing. Calling it twice is
// safe.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.stopDeliveries()
		<-s.deliveriesDone
		s.webhookTr.CloseIdleConnections()
		_ = s.http.Close()
		s.hungMu.Lock()
		for c := range s.hung {
			_ = c.Close()
		}
		s.hungMu.Unlock()
		// Drop the data too: a test harness may keep a closed *Server
		// reachable (testing keeps cleanup closures after running them),
		// and 100k retained charges would skew the next benchmark run's
		// heap and GC.
		s.store.drop()
		s.meters.drop()
		s.idem.drop()
	})
}

// Now is the emulator's current time; `created` timestamps come from it.
func (s *Server) Now() time.Time { return s.clock.Now() }

// Advance moves the emulator's clock forward by d (backward when negative).
func (s *Server) Advance(d time.Duration) { s.clock.Advance(d) }

// SetNow sets the emulator's clock to t.
func (s *Server) SetNow(t time.Time) { s.clock.Set(t) }

// SetKeyPermissions configures a restricted key (rk_...) and the permissions
// it holds, e.g. "charges_read", "payment_intents_read". Any other request
// made with it gets Stripe's 403. Calling it again replaces the set.
func (s *Server) SetKeyPermissions(key string, perms ...string) {
	set := make(map[string]bool, len(perms))
	for _, p := range perms {
		set[p] = true
	}
	s.perms.Store(key, set)
}

// apiCall is one authenticated /v1 request as the endpoint handlers see it.
type apiCall struct {
	r        *http.Request
	key      string
	livemode bool
	form     formValues
	id       string // path parameter, e.g. the charge id in /v1/charges/{id}
	idemKey  string
	perms    map[string]bool // nil for secret keys: everything allowed
}

// response is what a handler produces. The pipeline, not the handler, writes
// it, so the idempotency layer can record it and the drop fault can discard it.
type response struct {
	status int
	body   []byte
	// cache says whether the idempotency layer stores this response. Stripe
	// stores results of requests that began executing; validation failures
	// are not stored.
	cache bool
	// createdCharge is set when the request committed a new charge, making
	// it eligible for the commit-then-drop fault.
	createdCharge bool
	// createdMeterEvent is set when the request recorded a meter event,
	// making it eligible for DropNextMeterEvents.
	createdMeterEvent bool
	// shouldRetry, when set, is sent as the Stripe-Should-Retry header.
	shouldRetry string
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_sim/") {
		s.serveAdmin(w, r)
		return
	}
	rt, id, ok := route(r.Method, r.URL.Path)
	if !ok {
		s.count(r.Method + " unknown")
		s.writeResp(w, r, errorResp(http.StatusNotFound, stripeError{
			Type:    "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path),
		}), false)
		return
	}
	s.count(rt.kind)

	c := &apiCall{r: r, id: id}
	if resp, ok := s.authenticate(c); !ok {
		s.writeResp(w, r, resp, false)
		return
	}
	if resp, ok := s.authorize(c, rt.perm); !ok {
		s.writeResp(w, r, resp, false)
		return
	}
	form, err := parseForm(r)
	if err != nil {
		s.writeResp(w, r, invalidRequest(http.StatusBadRequest, "", "Invalid request body: "+err.Error()), false)
		return
	}
	c.form = form
	if resp, ok := s.injectPreExecution(r, c.livemode); !ok {
		s.writeResp(w, r, resp, false)
		return
	}

	if r.Method != http.MethodPost {
		s.sleepLatency(r, rt)
		s.hook(rt.kind)
		s.writeResp(w, r, rt.handle(s, c), false)
		return
	}

	c.idemKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if c.idemKey == "" {
		// stripe-go always sends a key on POST; a client that does not gets
		// no protection, exactly like Stripe.
		s.sleepLatency(r, rt)
		s.hook(rt.kind)
		s.finishPost(w, r, rt.handle(s, c))
		return
	}
	if len(c.idemKey) > 255 {
		s.writeResp(w, r, invalidRequest(http.StatusBadRequest, "",
			"Keys for idempotent requests can only be 255 characters long."), false)
		return
	}
	ent, replay, resp := s.idem.begin(c.key, c.idemKey, fingerprint(r.Method, r.URL.Path, form), s.Now())
	if replay != nil {
		s.writeResp(w, r, *replay, true)
		return
	}
	if ent == nil {
		s.writeResp(w, r, resp, false)
		return
	}
	s.sleepLatency(r, rt)
	s.hook(rt.kind)
	resp = rt.handle(s, c)
	// Record before replying (or dropping): the whole point of the drop fault
	// is that the retry must find the committed result.
	s.idem.finish(ent, resp)
	s.finishPost(w, r, resp)
}

func (s *Server) hook(kind string) {
	if s.testHookExecute != nil {
		s.testHookExecute(kind)
	}
	if s.cfg.OnExecute != nil {
		s.cfg.OnExecute(kind)
	}
}

// finishPost replies, unless the commit-then-drop fault picks this request.
func (s *Server) finishPost(w http.ResponseWriter, r *http.Request, resp response) {
	if resp.createdCharge && s.faults.shouldDrop() {
		s.log.Info("stripesim: dropping connection after committed charge", slog.String("path", r.URL.Path))
		s.drop(w)
		return
	}
	if resp.createdMeterEvent && takeOne(&s.faults.dropMeter) {
		s.log.Info("stripesim: dropping connection after recorded meter event", slog.String("path", r.URL.Path))
		s.drop(w)
		return
	}
	s.writeResp(w, r, resp, false)
}

// drop hijacks the connection and closes it without a byte of response, so
// the client sees EOF (or, with DropHang, waits until it gives up).
func (s *Server) drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Cannot hijack (HTTP/2): fall back to aborting the handler, which
		// also resets the stream without a response.
		panic(http.ErrAbortHandler)
	}
	if !s.faults.current().DropHang {
		_ = conn.Close()
		return
	}
	s.hungMu.Lock()
	select {
	case <-s.closing:
		s.hungMu.Unlock()
		_ = conn.Close()
		return
	default:
	}
	s.hung[conn] = struct{}{}
	s.hungMu.Unlock()
	// Hold the connection until the client hangs up or the server closes.
	_, _ = io.Copy(io.Discard, conn)
	s.hungMu.Lock()
	delete(s.hung, conn)
	s.hungMu.Unlock()
	_ = conn.Close()
}

func (s *Server) writeResp(w http.ResponseWriter, r *http.Request, resp response, replayed bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", "req_sim_"+strconv.FormatUint(s.requestSeq.Add(1), 10))
	if v := r.Header.Get("Stripe-Version"); v != "" {
		h.Set("Stripe-Version", v)
	}
	if k := r.Header.Get("Idempotency-Key"); k != "" && r.Method == http.MethodPost {
		h.Set("Idempotency-Key", k)
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	if resp.shouldRetry != "" {
		h.Set("Stripe-Should-Retry", resp.shouldRetry)
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.body)))
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

func (s *Server) count(kind string) {
	s.countsMu.Lock()
	s.counts[kind]++
	s.countsMu.Unlock()
}

// authenticate checks the bearer key. Secret keys (sk_test_, sk_live_) may do
// everything; restricted keys must have been configured.
func (s *Server) authenticate(c *apiCall) (response, bool) {
	auth := c.r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		// Stripe also takes the key as the Basic-auth user (curl -u sk_...:).
		key, _, ok = c.r.BasicAuth()
	}
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return errorResp(http.StatusUnauthorized, stripeError{
			Type:    "invalid_request_error",
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
		}), false
	}
	c.key = key
	c.livemode = strings.Contains(key, "_live_")
	switch {
	case strings.HasPrefix(key, "sk_test_"), strings.HasPrefix(key, "sk_live_"):
		return response{}, true
	case strings.HasPrefix(key, "rk_"):
		if v, ok := s.perms.Load(key); ok {
			c.perms = v.(map[string]bool)
			return response{}, true
		}
	}
	return errorResp(http.StatusUnauthorized, stripeError{
		Type:    "invalid_request_error",
		Message: "Invalid API Key provided: " + redactKey(key),
	}), false
}

// authorize answers a restricted key that lacks perm with Stripe's 403.
func (s *Server) authorize(c *apiCall, perm string) (response, bool) {
	if c.perms == nil || c.perms[perm] {
		return response{}, true
	}
	return forbidden(c.key, perm), false
}

// require is authorize for permissions that depend on parameters (expand).
func (c *apiCall) require(perm string) (response, bool) {
	if c.perms == nil || c.perms[perm] {
		return response{}, true
	}
	return forbidden(c.key, perm), false
}

func forbidden(key, perm string) response {
	return errorResp(http.StatusForbidden, stripeError{
		Type: "invalid_request_error",
		Message: fmt.Sprintf("The provided key '%s' does not have the required permissions for this endpoint "+
			"on account 'acct_stripesim'. Having the '%s' permission would allow this request to continue.",
			redactKey(key), rakName(perm)),
	})
}

// rakName maps our permission names to the ones Stripe prints, e.g.
// "charges_write" → "rak_charge_write".
func rakName(perm string) string {
	for _, access := range []string{"_read", "_write"} {
		if resource, ok := strings.CutSuffix(perm, access); ok {
			return "rak_" + strings.TrimSuffix(resource, "s") + access
		}
	}
	return "rak_" + perm
}

// redactKey never echoes a full key: the type prefix ("rk_test_"), stars,
// and the last four characters when the secret part is long enough that
// four characters reveal little.
func redactKey(key string) string {
	prefix := ""
	if parts := strings.SplitN(key, "_", 3); len(parts) == 3 {
		prefix = parts[0] + "_" + parts[1] + "_"
	}
	tail := ""
	if len(key)-len(prefix) > 8 {
		tail = key[len(key)-4:]
	}
	return prefix + "***" + tail
}

// stripeError is the body of Stripe's {"error": {...}} envelope.
type stripeError struct {
	Type          string `json:"type"`
	Code          string `json:"code,omitempty"`
	DeclineCode   string `json:"decline_code,omitempty"`
	AdviceCode    string `json:"advice_code,omitempty"`
	Message       string `json:"message"`
	Param         string `json:"param,omitempty"`
	Charge        string `json:"charge,omitempty"`
	PaymentIntent any    `json:"payment_intent,omitempty"`
	DocURL        string `json:"doc_url,omitempty"`
}

func errorResp(status int, e stripeError) response {
	body, _ := json.Marshal(map[string]stripeError{"error": e})
	return response{status: status, body: body}
}

func invalidRequest(status int, param, msg string) response {
	return errorResp(status, stripeError{Type: "invalid_request_error", Param: param, Message: msg})
}

func missing(kind, param, id string) response {
	return errorResp(http.StatusNotFound, stripeError{
		Type: "invalid_request_error", Code: "resource_missing", Param: param,
		Message: fmt.Sprintf("No such %s: '%s'", kind, id),
	})
}

func jsonResp(v any) response {
	body, err := json.Marshal(v)
	if err != nil {
		return errorResp(http.StatusInternalServerError, stripeError{Type: "api_error", Message: err.Error()})
	}
	return response{status: http.StatusOK, body: body, cache: true}
}

// newClock is frozen at start, or follows wall time when start is zero.
func newClock(start time.Time) *clock.Sim {
	if start.IsZero() {
		return clock.NewSimFollowing()
	}
	return clock.NewSim(start)
}
