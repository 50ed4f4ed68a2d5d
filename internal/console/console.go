// Package console is pelguard's web console (issue 20, the pelguard-console
// binary): server-rendered pages over the ledger, the audit tables and Redis
// — an overview, the findings, the dead letters and one customer's period —
// and, only with AllowActions, the actions a person decides: refund,
// dismiss or resolve a finding, replay dead letters.
//
// Everything that can move money goes through the code the CLI uses (the
// auditor's Refund with its re-reads and its persisted rolling cap, the
// consumer's replay), behind a per-user identity, a CSRF token, a
// confirmation page with a required reason and a one-time token (a double
// submit acts once), and is recorded in console_actions and sent to Slack.
package console

import (
	"cmp"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// Defaults applied by New.
const (
	// DefaultPageSize is the rows a table shows before "older".
	DefaultPageSize = 50
	// DefaultDeadLetterScan bounds how many dead letters a page or the
	// overview's counts by reason read from one stream.
	DefaultDeadLetterScan = 10_000
	// DefaultMaxReplay bounds one "replay all of a reason".
	DefaultMaxReplay = 1000
	// DefaultSessionTTL is how long a login lasts.
	DefaultSessionTTL = 8 * time.Hour
	// DefaultDashboardURL is Stripe's dashboard; charge links are
	// <DashboardURL>/payments/<charge id> (…/test/payments/… for test keys).
	DefaultDashboardURL = "https://dashboard.stripe.com"
	// DefaultRefresh is how often the live pages reload themselves.
	DefaultRefresh = 15 * time.Second
)

// KindConsoleAction is the Slack alert of every console action.
const KindConsoleAction alerts.Kind = "console_action"

// Stream is a stream the console shows and its consumer group.
type Stream struct {
	Name, Group string
	// Meter: a meter-event stream (pelguard-consumer meter-events): the PEL
	// page judges it against the meter ledger.
	Meter bool
}

// Config configures a Server.
type Config struct {
	// DB reaches the ledger and the audit tables; required.
	DB *pgxpool.Pool
	// Schema holds pelguard's tables (default "pelguard").
	Schema string
	// Redis and Streams: the PEL and dead letters shown; required.
	Redis   redis.UniversalClient
	Streams []Stream

	// Users are the people who may log in, name → bcrypt hash (see
	// LoadUsers). Or ProxyUserHeader names the header an authenticating
	// reverse proxy sets, believed only from TrustedProxies. Exactly one of
	// the two is required: every page and action has a named person.
	Users           map[string][]byte
	ProxyUserHeader string
	TrustedProxies  []netip.Prefix

	// AllowActions enables refund, dismiss, resolve and replay. Without it
	// the console is read-only and every action is refused (403).
	AllowActions bool
	// Auditor refunds (its Config's MaxRefunds24h/MaxCents24h are the
	// rolling cap every refunder shares). nil: refunds are not offered.
	Auditor *audit.Auditor
	// MaxRefundCents bounds one refund from the console (default
	// audit.DefaultMaxCents), under the rolling cap.
	MaxRefundCents int64
	// Stripe re-reads the charges a page shows (never counted in page
	// time); nil shows the ledger's and the findings' view only.
	Stripe *stripeapi.Client
	// DashboardURL prefixes charge links (default DefaultDashboardURL, with
	// /test when TestMode).
	DashboardURL string
	TestMode     bool
	// Notifier receives one alert per action; nil logs only.
	Notifier alerts.Notifier
	Logger   *slog.Logger
	Clock    clock.Clock

	PageSize       int
	DeadLetterScan int
	MaxReplay      int
	SessionTTL     time.Duration
	// LoginWindow, MaxLoginFailuresPerUser and MaxLoginFailuresPerAddr
	// rate-limit logins: a name or an address that failed that many times
	// within the window is refused (even with the right password) until its
	// oldest counted failure leaves the window; a successful login resets
	// the name's count. Defaults: DefaultLoginWindow, 5 and 20. Counted in
	// Postgres, so every replica agrees.
	LoginWindow             time.Duration
	MaxLoginFailuresPerUser int
	MaxLoginFailuresPerAddr int
	// Reaper is the reaper's policy the PEL page judges entries by.
	Reaper ReaperPolicy
	// ConsumerIdle is the reaper's --consumer-idle: a consumer gone this
	// long (no heartbeat, no read) and holding nothing leaves the
	// consumers panel. Zero means reaper.DefaultConsumerIdle; negative
	// keeps every consumer listed.
	ConsumerIdle time.Duration
	// Refresh is how often the overview and the PEL page reload themselves
	// (a meta refresh: no script). Zero means DefaultRefresh; negative
	// turns it off. ?refresh=0 turns it off for one page.
	Refresh time.Duration
	// PrometheusURL, when set, is where the overview reads the fleet's
	// Stripe limiter figures (rate by role, waits, 429s): they live in each
	// process's metrics, which Prometheus gathers.
	PrometheusURL string

	// SecureCookies marks the session cookie Secure (TLS, or TLS at the
	// proxy). The server sets it itself for TLS requests.
	SecureCookies bool
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("a Postgres pool (DB) is required"))
	}
	if c.Schema != "" {
		if err := pg.ValidSchema(c.Schema); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Redis == nil {
		errs = append(errs, errors.New("a Redis client is required"))
	}
	if len(c.Streams) == 0 {
		errs = append(errs, errors.New("at least one stream is required"))
	}
	switch {
	case len(c.Users) == 0 && c.ProxyUserHeader == "":
		errs = append(errs, errors.New("no identity: give a users file (--users-file) or a proxy's user header (--proxy-user-header with --trusted-proxy); the console has no anonymous mode"))
	case len(c.Users) > 0 && c.ProxyUserHeader != "":
		errs = append(errs, errors.New("give a users file or a proxy user header, not both"))
	case c.ProxyUserHeader != "" && len(c.TrustedProxies) == 0:
		errs = append(errs, errors.New("--proxy-user-header needs --trusted-proxy: a header anyone can send is not an identity"))
	}
	if c.PageSize < 0 || c.DeadLetterScan < 0 || c.MaxReplay < 0 || c.MaxRefundCents < 0 || c.SessionTTL < 0 ||
		c.LoginWindow < 0 || c.MaxLoginFailuresPerUser < 0 || c.MaxLoginFailuresPerAddr < 0 {
		errs = append(errs, errors.New("page size, scan and replay bounds, refund cents, session TTL and login limits must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.DeadLetterScan = cmp.Or(c.DeadLetterScan, DefaultDeadLetterScan)
	c.MaxReplay = cmp.Or(c.MaxReplay, DefaultMaxReplay)
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.LoginWindow = cmp.Or(c.LoginWindow, DefaultLoginWindow)
	c.MaxLoginFailuresPerUser = cmp.Or(c.MaxLoginFailuresPerUser, DefaultMaxLoginFailuresPerUser)
	c.MaxLoginFailuresPerAddr = cmp.Or(c.MaxLoginFailuresPerAddr, DefaultMaxLoginFailuresPerAddr)
	c.Refresh = cmp.Or(c.Refresh, DefaultRefresh)
	c.ConsumerIdle = cmp.Or(c.ConsumerIdle, reaper.DefaultConsumerIdle)
	c.MaxRefundCents = cmp.Or(c.MaxRefundCents, audit.DefaultMaxCents)
	c.DashboardURL = strings.TrimRight(cmp.Or(c.DashboardURL, DefaultDashboardURL), "/")
	if c.TestMode {
		c.DashboardURL += "/test"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Notifier == nil {
		c.Notifier = alerts.NewLog(c.Logger)
	}
	c.Clock = clock.Or(c.Clock)
	return c
}

//go:embed templates/*.html static/*
var assets embed.FS

// Server is the console as an http.Handler.
type Server struct {
	cfg      Config
	db       pg.DB
	store    *audit.Store
	auth     *authenticator
	pages    map[string]*template.Template
	mux      *http.ServeMux
	log      *slog.Logger
	replayMu chan struct{} // one replay at a time in this process
	// explainer is a dry-run reaper: the PEL page's verdicts.
	explainer *reaper.Reaper
	// meters reads the meter caps and their use (the Usage page).
	meters *meterledger.Ledger
	// hours caches the charts' counts of the hours that are over.
	hours hourCache
	// liveOff leaves the live pipeline and the charts off the overview:
	// the benchmark's baseline, the overview as it was before them.
	liveOff bool
}

// New validates cfg and builds the Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("console config: %w", err)
	}
	cfg = cfg.withDefaults()
	db := pg.NewDB(cfg.DB, cfg.Schema)
	auth, err := newAuthenticator(cfg, db)
	if err != nil {
		return nil, err
	}
	meters, err := meterledger.New(cfg.DB, meterledger.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, db: db, store: audit.NewStore(cfg.DB, cfg.Schema), auth: auth,
		log: cfg.Logger, replayMu: make(chan struct{}, 1), meters: meters}
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if s.explainer, err = newExplainer(cfg); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.Handle("POST /logout", s.authed(s.logout))
	m.Handle("GET /{$}", s.authed(s.overview))
	m.Handle("GET /findings", s.authed(s.findings))
	m.Handle("GET /findings/{id}", s.authed(s.finding))
	m.Handle("GET /findings/{id}/confirm", s.authed(s.confirmFinding))
	m.Handle("POST /findings/{id}/{action}", s.action(s.doFinding))
	m.Handle("GET /dead", s.authed(s.deadLetters))
	m.Handle("GET /dead/confirm", s.authed(s.confirmReplay))
	m.Handle("POST /dead/replay", s.action(s.doReplay))
	m.Handle("GET /customer", s.authed(s.customer))
	m.Handle("GET /search", s.authed(s.searchPage))
	m.Handle("GET /actions", s.authed(s.actions))
	m.Handle("GET /ledger", s.authed(s.ledgerPage))
	m.Handle("GET /usage", s.authed(s.usagePage))
	m.Handle("GET /meter-events", s.authed(s.meterEventsPage))
	m.Handle("GET /actions/{id}", s.authed(s.actionPage))
	m.Handle("GET /pel", s.authed(s.pelPage))
	s.mux = m
}

// ServeHTTP serves the console with its security headers on every answer.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script at all, styles from this server only, no framing.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin: links out (the Stripe dashboard) carry no referrer, and
	// the console's own form posts keep their Origin for sameOrigin.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.TLS != nil {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if why := badInput(w, r); why != "" {
		http.Error(w, "bad request: "+why, http.StatusBadRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Now is the console's clock.
func (s *Server) now() time.Time { return s.cfg.Clock.Now() }
