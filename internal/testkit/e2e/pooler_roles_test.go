package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

// pooled is one role test's world behind the shared PgBouncer: a migrated
// schema of its own, a stream and the emulator, and the roles' environment
// with DATABASE_URL pointed at the pooler.
type pooled struct {
	ctx    context.Context
	pool   *pgxpool.Pool // straight to Postgres, for the test's own reads
	b      *pgbouncer.Bouncer
	dbURL  string
	schema string
	db     string
	rdb    *redis.Client
	stream string
	group  string
	sim    *stripesim.Server
	mode   string // the roles' query mode, as URL parameters ("": pelguard's default)
}

func newPooled(t *testing.T, b *pgbouncer.Bouncer, prefix, mode string) *pooled {
	t.Helper()
	pool, dbURL := testenv.DBWithURL(t)
	w := &pooled{ctx: context.Background(), pool: pool, b: b, dbURL: dbURL, schema: testenv.SchemaOfURL(dbURL), db: dbName(t, dbURL),
		rdb: testenv.Redis(t), stream: testenv.Name(t, prefix), group: "billing-group", mode: mode}
	testenv.CleanupKeys(t, w.rdb, w.stream, w.stream+":dead")
	w.sim = stripesim.MustNew(stripesim.Config{})
	t.Cleanup(w.sim.Close)
	return w
}

// env is the roles' environment through the pooler; query adds URL
// parameters (e.g. default_query_exec_mode=exec).
func (w *pooled) env(t *testing.T, query string, extra ...string) []string {
	t.Helper()
	return baseEnv(append([]string{"DATABASE_URL=" + inDatabase(t, w.b.URL(query), w.db), "PELGUARD_DB_SCHEMA=" + w.schema,
		"REDIS_URL=" + testenv.RedisURL(), "STRIPE_API_KEY=" + testKey, "STRIPE_API_BASE=" + w.sim.URL()}, extra...)...)
}

func (w *pooled) add(t *testing.T, payload string) {
	t.Helper()
	if err := w.rdb.XAdd(w.ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": payload}}).Err(); err != nil {
		t.Fatal(err)
	}
}

// count runs a count query straight to Postgres ({schema} replaced).
func (w *pooled) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(w.ctx, strings.ReplaceAll(q, "{schema}", w.schema), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (w *pooled) pending(t *testing.T) int64 {
	t.Helper()
	p, err := w.rdb.XPending(w.ctx, w.stream, w.group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// onceEach fails unless each of customers has exactly one succeeded charge
// at the emulator and no other customer has any.
func (w *pooled) onceEach(t *testing.T, customers []string) {
	t.Helper()
	got := map[string]int{}
	for _, c := range w.sim.Charges() {
		if c.Status == "succeeded" {
			got[c.Customer]++
		}
	}
	for _, c := range customers {
		if got[c] != 1 {
			t.Errorf("%s: %d succeeded charges, want 1", c, got[c])
		}
	}
	if len(got) != len(customers) {
		t.Errorf("%d customers charged, want %d: %v", len(got), len(customers), got)
	}
	if t.Failed() {
		t.FailNow()
	}
}

func chargeEvent(i int, prefix string) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("%s%02d", prefix, i), StripeCustomerID: fmt.Sprintf("cus_%s%02d", prefix, i),
		AmountCents: int64(1000 + i), Currency: "usd", BillingPeriod: "2026-11"}
}

// Through one PgBouncer in transaction mode (its stock configuration, the
// URL without search_path), every role that touches the ledger does its
// work exactly once: the reaper re-drives stuck entries, the consumer bills
// and parks, replay (the command and the console's action) charges the
// parked events once, import rebuilds a lost ledger (in cache_describe and
// in exec mode), the webhook receiver settles a bank debit, the meter
// consumer counts usage once and the meter reaper sends nothing twice, and
// of two auditor runs started together exactly one runs. The roles run in
// pelguard's query mode and again in exec, which a team may name in the URL.
func TestRolesThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := pgbouncer.Start(t, pgbouncer.Config{})
	// pelguard's query mode, and exec, which a team may name in the URL
	// (parameters typed by their Go types).
	for _, mode := range []struct{ name, query string }{{"cache_describe", ""}, {"exec", "default_query_exec_mode=exec"}} {
		t.Run(mode.name+"/charges_reaper_replay_console_import", func(t *testing.T) { t.Parallel(); chargesThroughPooler(t, b, mode.query) })
		t.Run(mode.name+"/webhook", func(t *testing.T) { t.Parallel(); webhookThroughPooler(t, b, mode.query) })
		t.Run(mode.name+"/meter", func(t *testing.T) { t.Parallel(); meterThroughPooler(t, b, mode.query) })
	}
	t.Run("two_auditor_runs_at_once", func(t *testing.T) { t.Parallel(); twoAuditorRunsThroughPooler(t, b) })
}

func chargesThroughPooler(t *testing.T, b *pgbouncer.Bouncer, mode string) {
	w := newPooled(t, b, "pooled", mode)
	env := w.env(t, w.mode)
	if err := w.rdb.XGroupCreateMkStream(w.ctx, w.stream, w.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	var customers []string

	// The reaper: entries a consumer read and died with, nothing charged.
	for i := range 3 {
		e := chargeEvent(i, "s")
		customers = append(customers, e.StripeCustomerID)
		w.add(t, e.Payload())
	}
	if err := w.rdb.XReadGroup(w.ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: "gone-1", Streams: []string{w.stream, ">"}, Count: 3}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past --min-idle
	for range 2 {
		r := runBin(t, "reaper", env, 2*time.Minute, "run", "--once", "--stream", w.stream, "--min-idle", "200ms", "--metrics-addr", "", "--stopped-consumers", "gone-1")
		if r.code != 0 {
			t.Fatalf("reaper --once through the pooler: exit %d\n%s", r.code, r.out)
		}
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`); n != 3 || w.pending(t) != 0 {
		t.Fatalf("after two reaper runs: %d charged rows, %d pending; want 3 and 0", n, w.pending(t))
	}
	w.onceEach(t, customers)

	// The consumer: 10 events charged, 2 whose bank asks for
	// authentication parked (action_required).
	auth := []event.Event{chargeEvent(0, "a"), chargeEvent(1, "a")}
	if err := w.sim.SetFaults(stripesim.Faults{AuthRequiredCustomers: []string{auth[0].StripeCustomerID, auth[1].StripeCustomerID}}); err != nil {
		t.Fatal(err)
	}
	cons := startBin(t, "consumer", env, "run", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms", "--follow-up-every", "1h")
	for i := range 10 {
		e := chargeEvent(i, "c")
		customers = append(customers, e.StripeCustomerID)
		w.add(t, e.Payload())
	}
	for _, e := range auth {
		w.add(t, e.Payload())
	}
	dead := func() int64 { return w.rdb.XLen(w.ctx, w.stream+":dead").Val() }
	testenv.Eventually(t, 2*time.Minute, func() bool {
		return w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`) == 13 && dead() == 2 && w.pending(t) == 0
	}, "13 charged and 2 parked through the pooler (%d dead letters)", dead())
	if n := w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'action_required'`); n != 2 {
		t.Fatalf("%d action_required rows, want 2", n)
	}
	w.onceEach(t, customers)

	// The customers authenticated: one parked event replayed by the
	// command, the other by the console's action.
	if err := w.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := runBin(t, "consumer", env, time.Minute, "replay", "--stream", w.stream, "--reason", "action_required", "--limit", "1"); r.code != 0 || !strings.Contains(r.out, "replayed 1 dead letter") {
		t.Fatalf("replay through the pooler: exit %d\n%s", r.code, r.out)
	}
	consoleReplay(t, w, env)
	customers = append(customers, auth[0].StripeCustomerID, auth[1].StripeCustomerID)
	testenv.Eventually(t, time.Minute, func() bool {
		return w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`) == 15 && dead() == 0 && w.pending(t) == 0
	}, "the two replayed events charged (%d dead letters, %d pending, %d charged rows)\n%s", dead(), w.pending(t),
		w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged'`), cons.out.String()+fmt.Sprint(w.rdb.XPendingExt(w.ctx, &redis.XPendingExtArgs{Stream: w.stream, Group: w.group, Start: "-", End: "+", Count: 10}).Val())+fmt.Sprint(w.rdb.XRange(w.ctx, w.stream, "-", "+").Val()))
	out := cons.stop()
	if strings.Contains(out, "prepared statement") {
		t.Fatalf("the consumer hit prepared statements through the pooler:\n%s", out)
	}
	w.onceEach(t, customers)

	// Import: the ledger loses its rows (restored from an old backup);
	// import --from-stripe rebuilds them from Stripe, in exec mode (its
	// parameters typed by their Go types), then a rerun in pelguard's
	// mode changes nothing.
	if _, err := w.pool.Exec(w.ctx, `DELETE FROM `+w.schema+`.billing_records`); err != nil {
		t.Fatal(err)
	}
	for i, query := range []string{"default_query_exec_mode=exec", ""} {
		r := runBin(t, "consumer", w.env(t, query), 2*time.Minute, "import", "--from-stripe", "--period", "2026-11", "--json")
		if r.code != 0 {
			t.Fatalf("import through the pooler (%q): exit %d\n%s", query, r.code, r.out)
		}
		var sum struct {
			ImportedCharged int `json:"imported_charged"`
		}
		if j := r.out[strings.Index(r.out, "{") : strings.LastIndex(r.out, "}")+1]; json.Unmarshal([]byte(j), &sum) != nil {
			t.Fatalf("import summary:\n%s", r.out)
		}
		if want := []int{15, 0}[i]; sum.ImportedCharged != want {
			t.Fatalf("import through the pooler (%q): %d rows imported charged, want %d\n%s", query, sum.ImportedCharged, want, r.out)
		}
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.billing_records WHERE status = 'charged' AND charge_id IS NOT NULL`); n != 15 {
		t.Fatalf("after the imports: %d charged rows, want 15", n)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.import_runs`); n != 2 {
		t.Fatalf("%d import runs recorded, want 2", n)
	}
	w.onceEach(t, customers)
}

var consoleAddr = regexp.MustCompile(`console serving"? addr=([0-9.:]+)`)

// consoleReplay logs in to the console (a users-file login), loads its
// overview, and replays the oldest dead letter with its confirmation form.
func consoleReplay(t *testing.T, w *pooled, env []string) {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("pooled-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startBin(t, "console", env, "serve", "--stream", w.stream, "--users-file", users, "--listen", "127.0.0.1:0",
		"--allow-actions", "--wait-for-deps", "10s")
	addr := listenAddr(t, c, consoleAddr)
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := "http://" + addr
	call := func(method, path string, form url.Values) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(form.Encode()))
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, sb.String(), resp.Header.Get("Location")
	}
	if code, body, _ := call(http.MethodPost, "/login", url.Values{"user": {"alice"}, "password": {"pooled-pw"}, "next": {"/"}}); code != http.StatusSeeOther {
		t.Fatalf("console login through the pooler: %d\n%s", code, body)
	}
	if code, body, _ := call(http.MethodGet, "/", nil); code != http.StatusOK || !strings.Contains(body, "alice") {
		t.Fatalf("console overview through the pooler: %d\n%s", code, body)
	}
	left, err := w.rdb.XRange(w.ctx, w.stream+":dead", "-", "+").Result()
	if err != nil || len(left) != 1 {
		t.Fatalf("dead letters before the console's replay: %d (%v), want 1", len(left), err)
	}
	code, page, _ := call(http.MethodGet, "/dead/confirm?stream="+url.QueryEscape(w.stream)+"&id="+left[0].ID, nil)
	if code != http.StatusOK {
		t.Fatalf("console replay confirmation: %d\n%s", code, page)
	}
	v := url.Values{}
	for _, m := range regexp.MustCompile(`name="(csrf|token)" value="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		v.Set(m[1], m[2])
	}
	v.Set("stream", w.stream)
	v.Set("id", left[0].ID)
	v.Set("reason", "the customer authenticated")
	if code, body, loc := call(http.MethodPost, "/dead/replay", v); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/actions/") {
		t.Fatalf("console replay through the pooler: %d %q\n%s", code, loc, body)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE action = 'replay' AND outcome = 'done' AND actor = 'alice'`); n != 1 {
		t.Fatalf("%d console replay actions recorded done, want 1", n)
	}
	if n := w.count(t, `SELECT count(*) FROM {schema}.console_sessions`); n < 1 {
		t.Fatalf("no console session recorded for the login")
	}
	c.stop()
}

// listenAddr waits for the log line re matches and returns its address.
func listenAddr(t *testing.T, p *proc, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited: %v\n%s", p.name, err, p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s does not say where it listens:\n%s", p.name, p.out.String())
	return ""
}

var webhookAddr = regexp.MustCompile(`receiving Stripe webhooks"? addr=([0-9.:]+)`)

// The webhook receiver, through the pooler, settles a bank debit the
// consumer (through the pooler) recorded processing: one charge, charged.
func webhookThroughPooler(t *testing.T, b *pgbouncer.Bouncer, mode string) {
	w := newPooled(t, b, "pooledhook", mode)
	debit, card := chargeEvent(0, "d"), chargeEvent(1, "d")
	if err := w.sim.SetFaults(stripesim.Faults{DebitCustomers: []string{debit.StripeCustomerID}}); err != nil {
		t.Fatal(err)
	}
	hook := startBin(t, "consumer", w.env(t, w.mode, "PELGUARD_STRIPE_WEBHOOK_SECRET="+webhookSecret), "webhook", "--listen", "127.0.0.1:0", "--metrics-addr", "")
	addr := listenAddr(t, hook, webhookAddr)
	w.sim.SetWebhook(stripesim.Webhook{URL: "http://" + addr + consumer.WebhookPath, Secret: webhookSecret})
	cons := startBin(t, "consumer", w.env(t, w.mode), "run", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms", "--follow-up-every", "1h")
	w.add(t, debit.Payload())
	w.add(t, card.Payload())
	status := func(cus string) (s string) {
		_ = w.pool.QueryRow(w.ctx, `SELECT status FROM `+w.schema+`.billing_records WHERE stripe_customer_id = $1`, cus).Scan(&s)
		return s
	}
	testenv.Eventually(t, time.Minute, func() bool {
		return status(debit.StripeCustomerID) == "processing" && status(card.StripeCustomerID) == "charged"
	}, "the debit recorded processing, the card charged (debit %q)", status(debit.StripeCustomerID))
	var id string
	for _, c := range w.sim.Charges() {
		if c.Customer == debit.StripeCustomerID {
			id = c.ID
		}
	}
	if err := w.sim.Settle(id, true, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, func() bool { return status(debit.StripeCustomerID) == "charged" },
		"the webhook settled the debit through the pooler (status %q)\n%s", status(debit.StripeCustomerID), hook.out.String())
	if n := w.count(t, `SELECT count(*) FROM {schema}.webhook_events`); n < 1 {
		t.Fatalf("no webhook event recorded")
	}
	cons.stop()
	hook.stop()
	w.onceEach(t, []string{debit.StripeCustomerID, card.StripeCustomerID})
}

// The meter consumer, through the pooler, sends each usage event once; an
// entry put back in the PEL after its delivery is acked by the meter
// reaper without being sent again.
func meterThroughPooler(t *testing.T, b *pgbouncer.Bouncer, mode string) {
	const n = 20
	w := newPooled(t, b, "pooledmeter", mode)
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	env := w.env(t, w.mode)
	now := time.Now().UTC().Truncate(time.Second)
	var payloads []string
	for i := range n {
		e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_m%d", i%4), Value: int64(i + 1),
			Timestamp: now.Add(-time.Duration(i) * time.Second), EventID: fmt.Sprintf("req-%d", i)}
		payloads = append(payloads, e.Payload())
		w.add(t, e.Payload())
	}
	delivered := func() int { return w.count(t, `SELECT count(*) FROM {schema}.meter_events WHERE status = 'delivered'`) }
	c := superviseUntil(t, b, time.Minute, func() *proc {
		return startBin(t, "consumer", env, "meter-events", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms")
	}, func() bool {
		return w.sim.MeterEventCounts().Recorded == n && delivered() == n && w.pending(t) == 0
	}, func() string {
		return fmt.Sprintf("%d meter events sent through the pooler (Stripe %d, delivered rows %d)", n, w.sim.MeterEventCounts().Recorded, delivered())
	})
	if out := c.stop(); strings.Contains(out, "prepared statement") {
		t.Fatalf("the meter consumer hit prepared statements through the pooler:\n%s", out)
	}
	w.add(t, payloads[3])
	if err := w.rdb.XReadGroup(w.ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: "gone-1", Streams: []string{w.stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if r := runBin(t, "reaper", env, time.Minute, "run", "--once", "--meter-stream", w.stream, "--min-idle", "200ms", "--metrics-addr", ""); r.code != 0 {
		t.Fatalf("meter reaper through the pooler: exit %d\n%s", r.code, r.out)
	}
	if got := w.sim.MeterEventCounts().Recorded; got != n || delivered() != n || w.pending(t) != 0 {
		t.Fatalf("after the meter reaper: %d meter events at Stripe, %d delivered rows, %d pending; want %d, %d, 0", got, delivered(), w.pending(t), n, n)
	}
}

// Two auditor runs started together through the pooler: exactly one runs
// (its lease taken once), the other says another run holds the lease, and
// no lease and no advisory lock is left behind.
func twoAuditorRunsThroughPooler(t *testing.T, b *pgbouncer.Bouncer) {
	pool, dbURL := testenv.FreshDatabase(t)
	db := dbName(t, dbURL)
	if r := runBin(t, "consumer", baseEnv("DATABASE_URL="+dbURL), 2*time.Minute, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s", r.code, r.out)
	}
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	for i := range 3 {
		sim.SeedCharge(stripesim.ChargeSeed{Customer: fmt.Sprintf("cus_%d", i), Amount: 2500, Created: time.Now().Add(-3 * time.Hour)})
	}
	// Every Stripe call takes 4s: the run that takes the lease holds it
	// while the other starts and asks.
	if err := sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 4 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	schema := migrations.DefaultSchema
	env := baseEnv("DATABASE_URL="+inDatabase(t, b.URL(""), db), "PELGUARD_DB_SCHEMA="+schema, "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	lease := func() (owner string, epoch int64) {
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(owner, ''), epoch FROM `+schema+`.run_leases WHERE name = 'audit_run'`).Scan(&owner, &epoch)
		return owner, epoch
	}
	// free: released, or expired (a run the pooler cut off cannot release
	// its lease; it keeps its owner until the next run takes it over).
	free := func() bool {
		var ok bool
		_ = pool.QueryRow(context.Background(), `SELECT coalesce((SELECT owner IS NULL OR owner = '' OR expires_at <= now()
			FROM `+schema+`.run_leases WHERE name = 'audit_run'), true)`).Scan(&ok)
		return ok
	}
	args := []string{"run", "--settle-delay", "0", "--lock-wait", "0"}
	var ran, refused int
	var before int64
	for attempt := 1; ; attempt++ {
		// PgBouncer 1.18 may exit on the cancel request of the run that
		// is refused and exits (its own bug, "bad client state"); the kit
		// restarts it, and the scenario runs again, once, after the dead
		// run's lease expired.
		restarts := b.Restarts()
		testenv.Eventually(t, 90*time.Second, free, "the audit lease is released or expired")
		_, before = lease()
		ran, refused = 0, 0
		crashed := ""
		runs := []*proc{startBin(t, "auditor", env, args...), startBin(t, "auditor", env, args...)}
		for _, p := range runs {
			select {
			case <-p.done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("an auditor run did not end\n%s", p.out.String())
			}
			p.done <- nil // for stop's cleanup
			out := p.out.String()
			switch code := p.cmd.ProcessState.ExitCode(); {
			case code == 0 || code == 1:
				ran++
			case code == 2 && strings.Contains(out, "another audit run is in progress") && strings.Contains(out, "held by"):
				refused++
			default:
				crashed = fmt.Sprintf("an auditor run through the pooler: exit %d\n%s", code, out)
			}
		}
		if crashed == "" {
			break
		}
		if attempt == 1 && b.Restarts() > restarts {
			t.Logf("PgBouncer exited during the runs and was restarted; running them again:\n%s", crashed)
			continue
		}
		t.Fatal(crashed)
	}
	owner, after := lease()
	if ran != 1 || refused != 1 {
		t.Fatalf("of two runs started together: %d ran, %d refused; want 1 and 1", ran, refused)
	}
	if owner != "" || after != before+1 {
		t.Fatalf("after the runs: lease owner %q, epoch %d; want free at %d (taken exactly once)", owner, after, before+1)
	}
	if n := idleAdvisoryLocks(t, pool, db); n != 0 {
		t.Fatalf("%d advisory locks held by idle backends after the runs", n)
	}
}

// superviseUntil starts a role with start and waits up to timeout for
// done. A role that exits meanwhile fails the test with its output, unless
// the pooler crashed and the kit restarted it (PgBouncer 1.18 can crash on
// a cancel request under load): then the role is started again, as its
// supervisor would, up to twice.
func superviseUntil(t *testing.T, b *pgbouncer.Bouncer, timeout time.Duration, start func() *proc, done func() bool, what func() string) *proc {
	t.Helper()
	p := start()
	deadline := time.Now().Add(timeout)
	for again := 0; !done(); time.Sleep(10 * time.Millisecond) {
		select {
		case <-p.exited:
			if b.Restarts() == 0 || again == 2 {
				t.Fatalf("%s exited before %s\n%s", p.name, what(), p.out.String())
			}
			again++
			t.Logf("%s exited after the pooler was restarted; started again:\n%s", p.name, p.out.String())
			p = start()
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s\n%s's output:\n%s", timeout, what(), p.name, p.out.String())
		}
	}
	return p
}

// The pooler crashes (SIGKILL; the kit restarts it) while a meter consumer
// starts, and again once it runs: the consumer keeps going (a lost
// connection while it makes its partitions is tried again, not a stop)
// and every event is counted once.
func TestMeterConsumerOutlastsAPoolerRestart(t *testing.T) {
	t.Parallel()
	const n = 20
	b := pgbouncer.Start(t, pgbouncer.Config{})
	w := newPooled(t, b, "poolerkill", "default_query_exec_mode=exec")
	if _, err := w.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for i := range n {
		w.add(t, event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_k%d", i%4), Value: int64(i + 1),
			Timestamp: now.Add(-time.Duration(i) * time.Second), EventID: fmt.Sprintf("req-%d", i)}.Payload())
	}
	c := startBin(t, "consumer", w.env(t, w.mode), "meter-events", "--stream", w.stream, "--metrics-addr", "", "--block", "100ms")
	time.Sleep(200 * time.Millisecond)
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for killed := false; w.sim.MeterEventCounts().Recorded < n || w.pending(t) > 0; time.Sleep(20 * time.Millisecond) {
		select {
		case <-c.exited:
			t.Fatalf("the consumer stopped after the pooler's restart:\n%s", c.out.String())
		default:
		}
		if !killed && w.sim.MeterEventCounts().Recorded > 0 {
			killed = true
			if err := b.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %d of %d events counted, %d pending\n%s", w.sim.MeterEventCounts().Recorded, n, w.pending(t), c.out.String())
		}
	}
	// A call whose outcome the crash cut off is sent again under its
	// identifier: refused as a duplicate, counted once.
	if got := w.sim.MeterEventCounts().Recorded; got != n {
		t.Fatalf("Stripe counted %d events; want %d, each once", got, n)
	}
	c.stop()
}
