package chaos

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/stripeapi"
)

// stripeKey is the emulator's test key; it never leaves the process.
const stripeKey = "sk_test_pelguard_chaos"

// period is the billing period every event of the drill bills.
const period = "2026-11"

// drill is one run's shared state: the services and everything created on
// them, so close can remove it all.
type drill struct {
	cfg      Config
	runID    string
	rdb      redis.UniversalClient
	admin    *pgxpool.Pool
	progress *progress
	log      *slog.Logger
	// prep makes the usage scenarios' pelguard schema ahead (usageprep.go).
	prep *schemaPrep

	mu      sync.Mutex
	schemas []string
	keys    []string
}

func newDrill(ctx context.Context, cfg Config) (*drill, error) {
	// cli.OpenRedis also takes redis+cluster:// URLs: the drill runs on a
	// Redis Cluster as it does on one node (every key it uses per scenario
	// is on its own, so no command spans slots).
	rdb, err := cli.OpenRedis(ctx, cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%w (`make demo` starts a Redis)", err)
	}
	admin, err := pg.Open(ctx, cfg.DatabaseURL, 4)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	var b [4]byte
	_, _ = crand.Read(b[:])
	d := &drill{cfg: cfg, runID: hex.EncodeToString(b[:]), rdb: rdb, admin: admin, log: cfg.Logger,
		progress: &progress{w: cfg.Progress, rewrite: cfg.ProgressRewrite}}
	return d, nil
}

// close removes every schema and key the run created. It runs on a fresh
// context: an interrupted run must still clean up.
func (d *drill) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.mu.Lock()
	schemas, keys := d.schemas, d.keys
	d.schemas, d.keys = nil, nil
	d.mu.Unlock()
	for _, s := range schemas {
		d.dropSchema(ctx, s)
	}
	if len(keys) > 0 {
		if err := d.rdb.Del(ctx, keys...).Err(); err != nil {
			d.log.Warn("chaos: deleting the drill's streams failed", slog.Any("error", err), slog.Any("keys", keys))
		}
	}
	d.admin.Close()
	_ = d.rdb.Close()
}

func (d *drill) dropSchema(ctx context.Context, s string) {
	// s is built by the drill from a fixed prefix and hex: safe to splice.
	if _, err := d.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
		d.log.Warn("chaos: dropping schema failed", slog.String("schema", s), slog.Any("error", redact.Error(err)))
	}
}

// newSchema creates a migrated schema of the run's own and returns a pool
// and a URL (for the child process) whose search_path selects it.
func (d *drill) newSchema(ctx context.Context, suffix string) (*pgxpool.Pool, string, string, error) {
	schema := "chaos_" + d.runID + "_" + suffix
	d.mu.Lock()
	d.schemas = append(d.schemas, schema)
	d.mu.Unlock()
	if _, err := d.admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, "", "", fmt.Errorf("creating schema %s: %w", schema, redact.Error(err))
	}
	url := withSearchPath(d.cfg.DatabaseURL, schema)
	pool, err := pg.Open(ctx, url, 16)
	if err != nil {
		return nil, "", "", err
	}
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		pool.Close()
		return nil, "", "", fmt.Errorf("migrating %s: %w", schema, err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		pool.Close()
		return nil, "", "", fmt.Errorf("migrating %s: %w", schema, redact.Error(err))
	}
	return pool, url, schema, nil
}

// withSearchPath adds search_path to a postgres URL (pgx passes unknown
// query parameters to the server as run-time parameters).
func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// cell is one scenario in one mode: its own stream, schema, emulator and
// ledger clock.
type cell struct {
	d        *drill
	scenario string
	mode     string
	rdb      redis.UniversalClient
	redisURL string
	stream   string
	group    string
	sim      *stripesim.Server
	pool     *pgxpool.Pool
	dbURL    string
	schema   string
	clk      *clock.Sim
	ledger   *ledger.Ledger
	events   []event.Event
	rng      *rand.Rand
	log      *slog.Logger
	started  time.Time
	// usage is set on a usage scenario's cell (usage.go): events holds
	// no charge event then.
	usage *usageCell
}

func (d *drill) newCell(ctx context.Context, scenario, mode string, n int) (*cell, func(), error) {
	c := &cell{
		d: d, scenario: scenario, mode: mode, rdb: d.rdb, redisURL: d.cfg.RedisURL,
		stream: "chaos:" + d.runID + ":" + scenario + ":" + mode, group: "billing",
		// The clock follows wall time (Redis idle times and leases are real)
		// and jumps with the emulator when a scenario needs a day to pass.
		clk: clock.NewSimFollowing(),
		// The same seed gives both modes the same events and the same faults.
		rng:     rand.New(rand.NewPCG(uint64(d.cfg.Seed), scenarioStream(scenario))),
		log:     d.log.With(slog.String("scenario", scenario), slog.String("mode", mode)),
		started: time.Now(),
	}
	d.mu.Lock()
	d.keys = append(d.keys, c.stream, consumer.DeadLetterStream(c.stream))
	d.mu.Unlock()
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	sim, err := stripesim.New(stripesim.Config{Addr: "127.0.0.1:0", Seed: d.cfg.Seed})
	if err != nil {
		return nil, cleanup, err
	}
	c.sim = sim
	closers = append(closers, sim.Close)
	pool, url, schema, err := d.newSchema(ctx, fmt.Sprintf("%d", n))
	if err != nil {
		return nil, cleanup, err
	}
	c.pool, c.dbURL, c.schema = pool, url, schema
	closers = append(closers, pool.Close)
	c.ledger = ledger.New(pool, schema, c.clk)
	for i := range d.cfg.Events {
		c.events = append(c.events, event.Event{
			CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
			// Amounts vary with the seed so "dollars double-charged" is not
			// a multiple of one price; the verdicts must not care.
			AmountCents: 500 + 100*c.rng.Int64N(46), BillingPeriod: period, Currency: "usd",
		})
	}
	return c, cleanup, nil
}

// publish puts every event on the cell's stream (creating the group first,
// at "0", so the consumers see them all).
func (c *cell) publish(ctx context.Context) ([]string, error) {
	if err := consumer.EnsureGroup(ctx, c.rdb, c.stream, c.group); err != nil {
		return nil, err
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(c.events))
	for i, e := range c.events {
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: c.stream, Values: map[string]any{"payload": e.Payload()}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("publishing %d events: %w", len(c.events), err)
	}
	ids := make([]string, len(cmds))
	for i, cmd := range cmds {
		ids[i] = cmd.Val()
	}
	return ids, nil
}

// stripe builds an adapter on the cell's emulator. The naive code uses the
// Charges API as the seed does; pelguard uses PaymentIntents, its default.
// rt, when set, injects the scenario's faults.
func (c *cell) stripe(mode stripeapi.Mode, rt http.RoundTripper) (*stripeapi.Client, error) {
	var hc *http.Client
	if rt != nil {
		hc = &http.Client{Transport: rt}
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: stripeKey, BaseURL: c.sim.URL(), Mode: mode,
		MaxNetworkRetries: -1, Timeout: 10 * time.Second, HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("building the Stripe adapter: %w", err)
	}
	return sc, nil
}

// pick returns k distinct event indexes in [lo, hi), chosen by the seed.
func (c *cell) pick(k, lo, hi int) map[int]bool {
	out := map[int]bool{}
	for _, i := range c.rng.Perm(hi - lo)[:min(k, hi-lo)] {
		out[lo+i] = true
	}
	return out
}

func (c *cell) customers(idx map[int]bool) map[string]bool {
	out := map[string]bool{}
	for i := range idx {
		out[c.events[i].StripeCustomerID] = true
	}
	return out
}

// errNotDone is a scenario that did not finish within its deadline.
var errNotDone = errors.New("the scenario did not finish")

// state is what a wait looks at: the group's PEL and lag, the charges (or
// meter events) at the emulator and the terminal ledger rows.
type state struct {
	pending  int64
	lag      int64
	charges  int
	terminal int
	usage    bool
}

func (s state) String() string {
	if s.usage {
		return fmt.Sprintf("%d meter events at Stripe, %d pending, %d undelivered, %d settled in the ledger", s.charges, s.pending, max(s.lag, 0), s.terminal)
	}
	return fmt.Sprintf("%d charges, %d pending, %d undelivered, %d billed in the ledger", s.charges, s.pending, max(s.lag, 0), s.terminal)
}

// waitDrained waits until every entry of the stream has been delivered and
// acknowledged, and (pelguard) every event has a terminal ledger row.
func (c *cell) waitDrained(ctx context.Context) error {
	return c.waitUntil(ctx, func(s state) bool {
		return s.pending == 0 && s.lag == 0 && (c.mode != ModePelguard || s.terminal == c.eventCount())
	})
}

// stallTimeout is how long a phase may go without any progress (charges,
// PEL, lag or ledger rows changing) before the drill calls it stuck. A fixed
// deadline for the whole phase failed healthy runs on a loaded machine; a
// stuck run is one that stops moving, however slowly it moved before. The
// slowest legitimate pause is inflight-reclaim's slow Stripe call (3×
// min-idle) followed by the monitor's or reaper's min-idle.
func (c *cell) stallTimeout() time.Duration {
	if d := c.testDeadline(); d > 0 {
		return d
	}
	return max(DefaultStallTimeout, 10*c.d.cfg.MinIdle)
}

// phaseLimit bounds a phase that keeps moving but never finishes (a
// livelock): generous, and proportional to the work, about fifty times what
// an event takes on an idle machine.
func (c *cell) phaseLimit() time.Duration {
	if d := c.testDeadline(); d > 0 {
		return d
	}
	return 5*time.Minute + time.Duration(c.eventCount())*500*time.Millisecond
}

// eventCount is the number of events the cell published.
func (c *cell) eventCount() int {
	if c.usage != nil {
		return len(c.usage.events)
	}
	return len(c.events)
}

func (c *cell) testDeadline() time.Duration {
	if f := c.d.cfg.Test.Deadline; f != nil {
		return f(c.scenario + "/" + c.mode)
	}
	return 0
}

// waitUntil polls until done holds twice in a row. It polls real servers
// and other goroutines' effects on them, so a poll is the only way to wait;
// twice, 50 ms apart, because a monitor may be between XAUTOCLAIM and its
// charge when the PEL looks empty. It gives up when the state stops moving
// for stallTimeout, or after phaseLimit.
func (c *cell) waitUntil(ctx context.Context, done func(state) bool) error {
	stall, limit := c.stallTimeout(), c.phaseLimit()
	began := time.Now()
	moved := began
	var last state
	stable := 0
	for first := true; ; first = false {
		s, err := c.state(ctx)
		if err != nil {
			return err
		}
		now := time.Now()
		if first || s != last {
			last, moved = s, now
		}
		switch {
		case now.Sub(began) > limit:
			return fmt.Errorf("%w within %s: %s", errNotDone, limit, s)
		case done(s):
			if stable++; stable >= 2 {
				return nil
			}
		case now.Sub(moved) > stall:
			return fmt.Errorf("%w: no progress for %s (after %s): %s", errNotDone, stall, now.Sub(began).Round(time.Second), s)
		default:
			stable = 0
		}
		c.d.progress.update(c, s.String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *cell) state(ctx context.Context) (state, error) {
	groups, err := c.rdb.XInfoGroups(ctx, c.stream).Result()
	if err != nil {
		return state{}, fmt.Errorf("XINFO GROUPS %s: %w", c.stream, err)
	}
	s := state{lag: -1, usage: c.usage != nil}
	last := ""
	for _, g := range groups {
		if g.Name == c.group {
			s.pending, s.lag, last = g.Pending, g.Lag, g.LastDeliveredID
		}
	}
	if s.lag < 0 {
		// Redis cannot always tell the lag (after some rollbacks): compare
		// the group's last delivered id with the stream's last id instead.
		info, err := c.rdb.XInfoStream(ctx, c.stream).Result()
		if err != nil {
			return state{}, fmt.Errorf("XINFO STREAM %s: %w", c.stream, err)
		}
		s.lag = 0
		if info.LastGeneratedID != last {
			s.lag = 1
		}
	}
	if c.usage != nil {
		return s, c.usageState(ctx, &s)
	}
	s.charges = c.billable()
	counts, err := c.ledger.Counts(ctx)
	if err != nil {
		return state{}, fmt.Errorf("counting ledger rows: %w", err)
	}
	for st, n := range counts {
		if st.Terminal() {
			s.terminal += n
		}
	}
	return s, nil
}

// billable counts succeeded, unrefunded charges at the emulator.
func (c *cell) billable() int {
	n := 0
	for _, ch := range c.sim.Charges() {
		if ch.Status == "succeeded" && ch.AmountRefunded < ch.Amount {
			n++
		}
	}
	return n
}

// duplicates counts the charges beyond the first per Stripe customer and
// period, and what they took (the canonical, oldest charge is not counted).
func (c *cell) duplicates() (n int, cents int64) {
	for _, g := range c.sim.Duplicates() {
		n += len(g.ChargeIDs) - 1
		for _, a := range g.Amounts[1:] {
			cents += a
		}
	}
	return n, cents
}

func executable(cfg Config) (string, error) {
	if cfg.Executable != "" {
		return cfg.Executable, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the drill's own executable (to re-run it as the killed child): %w", err)
	}
	return exe, nil
}

// scenarioStream gives each scenario its own random stream under one seed.
func scenarioStream(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}
