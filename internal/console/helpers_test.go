package console

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	testKey      = "sk_test_console"
	testPeriod   = "2026-11"
	testNS       = "test"
	testPassword = "correct horse battery staple"
)

var (
	now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w0  = now.Add(-25 * time.Hour)
	w1  = now.Add(-time.Hour)
)

// bundle is one test's world: a migrated schema, the emulator, a stream,
// an auditor, the console behind an httptest server.
type bundle struct {
	pool    pg.DB
	ledger  *ledger.Ledger
	sim     *stripesim.Server
	clk     *clock.Sim
	rdb     *redis.Client
	stream  string
	group   string
	mem     *alerts.Memory
	auditor *audit.Auditor
	cfg     Config
	console *Server
	srv     *httptest.Server
}

func setup(t testing.TB, mod func(*Config)) *bundle {
	t.Helper()
	pool := testenv.DB(t)
	schema := testenv.SchemaOf(pool)
	sim := stripesim.MustNew(stripesim.Config{Now: now})
	t.Cleanup(sim.Close)
	clk := clock.NewSim(now)
	b := &bundle{pool: pg.NewDB(pool, schema), ledger: ledger.New(pool, schema, clk), sim: sim, clk: clk,
		rdb: testenv.Redis(t), stream: testenv.Name(t, "console"), group: "billing-group", mem: alerts.NewMemory()}
	testenv.CleanupKeys(t, b.rdb, b.stream, b.stream+":dead")
	var err error
	b.auditor, err = audit.New(audit.Config{DB: pool, Schema: schema, Clock: clk, Logger: testenv.Logger(t), Notifier: b.mem,
		Stripe: stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: -1}})
	if err != nil {
		t.Fatal(err)
	}
	stripe, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = Config{DB: pool, Schema: schema, Redis: b.rdb, Streams: []Stream{{Name: b.stream, Group: b.group}},
		Users: map[string][]byte{"alice": hash, "bob": hash}, AllowActions: true, Auditor: b.auditor, Stripe: stripe,
		TestMode: true, Notifier: b.mem, Logger: testenv.Logger(t), Clock: clk}
	if mod != nil {
		mod(&b.cfg)
	}
	s, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.console = s
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)
	return b
}

func key(cust string) string { return event.IdempotencyKey(cust, testPeriod, testNS) }

// duplicate seeds one key charged twice at Stripe, the ledger recording the
// first, and audits it: an open duplicate_charge finding for the second.
func (b *bundle) duplicate(t testing.TB, cust string, amount int64) (canon, dup string, findingID int64) {
	t.Helper()
	ctx := context.Background()
	meta := stripeapi.PelguardMetadata(cust, testPeriod, key(cust))
	canon = b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + cust, Amount: amount, Created: w0.Add(2 * time.Hour), Metadata: meta}).ID
	dup = b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + cust, Amount: amount, Created: w0.Add(3 * time.Hour), Metadata: meta}).ID
	at := w0.Add(2*time.Hour + time.Second)
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{{Key: ledger.Key{CustomerID: cust, BillingPeriod: testPeriod},
		StripeCustomerID: "cus_" + cust, AmountCents: amount, Currency: "usd", IdempotencyKey: key(cust), ChargeID: canon,
		FirstAttemptAt: at.Add(-time.Minute), ChargedAt: at, UpdatedAt: at}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.auditor.Run(ctx, audit.Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	fs, err := b.auditor.Store().Findings(ctx, audit.Filter{Kind: audit.KindDuplicate})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.ChargeID == dup {
			return canon, dup, f.ID
		}
	}
	t.Fatalf("no duplicate finding for %s", dup)
	return
}

// count runs a count(*) query.
func (b *bundle) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// client is a browser without a browser: a cookie jar, no redirects
// followed unless asked.
type client struct {
	t  testing.TB
	b  *bundle
	hc *http.Client
}

func (b *bundle) anon(t testing.TB) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, b: b, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *bundle) login(t testing.TB, user string) *client {
	t.Helper()
	c := b.anon(t)
	resp := c.post("/login", url.Values{"user": {user}, "password": {testPassword}, "next": {"/"}})
	if resp.code != http.StatusSeeOther {
		t.Fatalf("login as %s: %d %s", user, resp.code, resp.body)
	}
	return c
}

type response struct {
	code     int
	body     string
	location string
	header   http.Header
}

func (c *client) do(req *http.Request) response {
	c.t.Helper()
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{code: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

func (c *client) get(path string) response {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.b.srv.URL+path, nil)
	return c.do(req)
}

func (c *client) post(path string, form url.Values) response {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.b.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

func (c *client) mustGet(path string) string {
	c.t.Helper()
	r := c.get(path)
	if r.code != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", path, r.code, r.body)
	}
	return r.body
}

var hidden = regexp.MustCompile(`name="(csrf|token)" value="([^"]+)"`)

// form reads the hidden csrf and token fields of a page.
func form(t testing.TB, page string) url.Values {
	t.Helper()
	v := url.Values{}
	for _, m := range hidden.FindAllStringSubmatch(page, -1) {
		v.Set(m[1], m[2])
	}
	return v
}

// refunds counts the emulator's refund POSTs.
func (b *bundle) refundPosts() int64 { return b.sim.Requests()["POST /v1/refunds"] }
