package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// meterEventName is a usage scenario's meter (a sum meter at the
// emulator): one per scenario, so the scenarios' pelguard cells share a
// schema without sharing an identifier, a ledger row or a customer's slot.
func meterEventName(scenario string) string { return "api_requests_" + scenario }

// UsageResult is one usage scenario run in one mode, counted at the
// emulator: each customer's total of the meter against what the
// customer's events add up to. Its JSON form has exactly these fields.
type UsageResult struct {
	Scenario  string `json:"scenario"`
	Mode      string `json:"mode"`
	Events    int    `json:"events"`
	Customers int    `json:"customers"`
	// ExpectedUnits is what the events add up to; StripeUnits what the
	// meter's event summaries add up to over every customer.
	ExpectedUnits int64 `json:"expected_units"`
	StripeUnits   int64 `json:"stripe_units"`
	// OverCountUnits sums, over the customers Stripe bills too much, the
	// excess; OverCountEvents counts the events Stripe recorded beyond the
	// published ones; OverCountedCustomers counts those customers.
	OverCountUnits       int64 `json:"overcount_units"`
	OverCountEvents      int   `json:"overcount_events"`
	OverCountedCustomers int   `json:"overcounted_customers"`
	// UnderCountUnits sums what Stripe misses (usage lost): 0 in every mode.
	UnderCountUnits int64 `json:"undercount_units"`
	// Parked counts the events pelguard parked (unknown outcome past the
	// safe window: not re-sent, dead-lettered); Alerted the parked alerts.
	Parked  int `json:"parked"`
	Alerted int `json:"alerted"`
	// Error says why the cell did not finish; empty when it finished.
	Error string `json:"error,omitempty"`

	// OtherDeadLetters counts dead letters that are not parked events
	// (none is expected).
	OtherDeadLetters int `json:"-"`
	// CallsAfterGap counts the meter-event calls Stripe answered after
	// usage-25h-gap's day passed (-1 in the other scenarios): pelguard's
	// must be 0, since every entry left is delivered or of unknown outcome
	// past the safe window.
	CallsAfterGap int           `json:"-"`
	Elapsed       time.Duration `json:"-"`
}

// Failed reports whether the cell did not finish.
func (x UsageResult) Failed() bool { return x.Error != "" }

// usageFailures checks the usage verdicts: the naive sender over-counts in
// every usage scenario, the one with an identifier past Stripe's window;
// pelguard counts every customer exactly, parks with an alert what it
// cannot know, and loses nothing; no mode loses usage.
func (r Report) usageFailures() []string {
	var out []string
	for _, x := range r.Usage {
		name := x.Scenario + "/" + x.Mode
		if x.Failed() {
			out = append(out, fmt.Sprintf("%s: FAILED, the run is incomplete: %s", name, x.Error))
			continue
		}
		switch {
		case x.Mode == ModeNaive && x.OverCountUnits == 0,
			x.Mode == ModeNaiveIdentifier && x.Scenario == ScenarioUsage25hGap && x.OverCountUnits == 0:
			out = append(out, name+": the naive sender over-counted nothing, so the drill did not reproduce the failure mode")
		case x.Mode == ModePelguard && (x.OverCountUnits != 0 || x.OverCountEvents != 0):
			out = append(out, fmt.Sprintf("%s: pelguard over-counted %d unit(s) in %d event(s) for %d customer(s)",
				name, x.OverCountUnits, x.OverCountEvents, x.OverCountedCustomers))
		}
		if x.UnderCountUnits != 0 {
			out = append(out, fmt.Sprintf("%s: Stripe counts %d unit(s) fewer than the events add up to: usage lost", name, x.UnderCountUnits))
		}
		if x.Parked != x.Alerted {
			out = append(out, fmt.Sprintf("%s: %d event(s) parked but %d alert(s) sent", name, x.Parked, x.Alerted))
		}
		if x.OtherDeadLetters != 0 {
			out = append(out, fmt.Sprintf("%s: %d dead letter(s) other than parked events", name, x.OtherDeadLetters))
		}
		if x.Mode == ModePelguard && x.CallsAfterGap > 0 {
			out = append(out, fmt.Sprintf("%s: pelguard sent %d meter event(s) after the gap: past the safe window nothing may be re-sent", name, x.CallsAfterGap))
		}
	}
	return out
}

// parkedAlerts records the parked-event alerts of a cell (distinct by
// fingerprint: one event, one alert).
type parkedAlerts struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (a *parkedAlerts) Notify(x alerts.Alert) {
	if x.Kind != alerts.KindMeterEventParked {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	a.seen[x.Fingerprint] = true
}

func (a *parkedAlerts) Close(context.Context) error { return nil }

func (a *parkedAlerts) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

// usageCell is a cell's meter side.
type usageCell struct {
	events  []event.MeterEvent
	meterID string
	// from and to bound the events' timestamps ([from, to), minute-aligned
	// for the summaries).
	from, to time.Time
	ledger   *meterledger.Ledger // pelguard only
	alerts   *parkedAlerts
	// The dead letters, once read (readDeadLetters).
	deadRead          bool
	parked, otherDead int
	// settledBefore counts the shared schema's settled rows of earlier
	// scenarios among this cell's timestamps (pelguard).
	settledBefore int
	// callsAtGap is the emulator's meter-event answers when usage-25h-gap's
	// day has passed (-1: no gap).
	callsAtGap int64
	// tune, when set, adjusts the meter consumers' configuration (the
	// busy-customer scenario runs them as deployed: busy.go).
	tune func(*consumer.MeterConfig)
}

// meterCalls counts every answer the emulator gave to a meter-event call.
func (c *cell) meterCalls() int64 {
	n := c.sim.MeterEventCounts()
	return n.Recorded + n.Duplicates + n.Concurrent + n.RateLimited + n.Invalid + n.Rejected
}

// usageCellOf is a usage cell of scenario and mode: its stream (and dead
// letters) registered for the drill's cleanup, its emulator (with faults)
// holding the scenario's sum meter, and for pelguard the usage scenarios'
// schema (usageprep.go). cleanup closes the emulator.
func (d *drill) usageCellOf(ctx context.Context, scenario, mode string, faults stripesim.Faults) (*cell, func(), error) {
	c := &cell{
		d: d, scenario: scenario, mode: mode, rdb: d.rdb, redisURL: d.cfg.RedisURL,
		stream: "chaos:" + d.runID + ":" + scenario + ":" + mode, group: "billing",
		clk:     clock.NewSimFollowing(),
		rng:     rand.New(rand.NewPCG(uint64(d.cfg.Seed), scenarioStream(scenario))),
		log:     d.log.With(slog.String("scenario", scenario), slog.String("mode", mode)),
		started: time.Now(),
		usage:   &usageCell{alerts: &parkedAlerts{}, callsAtGap: -1},
	}
	d.mu.Lock()
	d.keys = append(d.keys, c.stream, consumer.DeadLetterStream(c.stream))
	d.mu.Unlock()
	cleanup := func() {}
	sim, err := stripesim.New(stripesim.Config{Addr: "127.0.0.1:0", Seed: d.cfg.Seed, Faults: faults})
	if err != nil {
		return nil, cleanup, err
	}
	c.sim, cleanup = sim, sim.Close
	m, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterEventName(scenario)})
	if err != nil {
		return nil, cleanup, err
	}
	c.usage.meterID = m.ID
	if mode == ModePelguard {
		ps, err := d.prep.take(ctx)
		if err != nil {
			return nil, cleanup, err
		}
		c.pool, c.dbURL, c.schema = ps.pool, ps.url, ps.schema // the prep's pool: not closed here
	}
	return c, cleanup, nil
}

// newUsageCell sets up a usage scenario's cell: its stream, emulator (with
// the scenario's sum meter), the events and, for pelguard, the usage
// scenarios' schema (usageprep.go). The events go round-robin over a
// quarter as many customers (at least 10), so a batch of 10 never holds two
// of one customer, and each customer's total is several events.
func (d *drill) newUsageCell(ctx context.Context, scenario, mode string) (*cell, func(), error) {
	c, cleanup, err := d.usageCellOf(ctx, scenario, mode, stripesim.Faults{})
	if err != nil {
		return nil, cleanup, err
	}
	sim := c.sim
	if mode == ModePelguard {
		if c.usage.ledger, err = meterledger.New(c.pool, meterledger.Config{Schema: c.schema, Clock: c.clk}); err != nil {
			return nil, cleanup, err
		}
	}
	customers := max(10, d.cfg.Events/4)
	// Distinct whole seconds (the fault key), the newest well inside
	// Stripe's 5 minutes ahead and the oldest far inside its 35 days, also
	// after usage-25h-gap's day.
	base := sim.Now().Add(-4 * time.Hour).Truncate(time.Minute)
	for i := range d.cfg.Events {
		c.usage.events = append(c.usage.events, event.MeterEvent{
			EventName: meterEventName(scenario), CustomerID: fmt.Sprintf("c_%d", i%customers),
			StripeCustomerID: fmt.Sprintf("cus_%d", i%customers),
			// Values vary with the seed so over-counted units are not a
			// multiple of one price; the verdicts must not care.
			Value: 1 + c.rng.Int64N(50), Timestamp: base.Add(time.Duration(i) * time.Second),
			EventID: fmt.Sprintf("use-%d", i),
		})
	}
	c.usage.from = base
	c.usage.to = base.Add(time.Duration(d.cfg.Events) * time.Second).Truncate(time.Minute).Add(time.Minute)
	if c.usage.ledger != nil {
		if c.usage.settledBefore, err = c.settledRows(ctx); err != nil {
			return nil, cleanup, err
		}
	}
	return c, cleanup, nil
}

// publishUsage puts every meter event on the stream, as its producer would.
func (c *cell) publishUsage(ctx context.Context) ([]string, error) {
	if err := consumer.EnsureGroup(ctx, c.rdb, c.stream, c.group); err != nil {
		return nil, err
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(c.usage.events))
	for i, e := range c.usage.events {
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: c.stream, Values: map[string]any{"payload": e.Payload()}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("publishing %d meter events: %w", len(cmds), err)
	}
	ids := make([]string, len(cmds))
	for i, cmd := range cmds {
		ids[i] = cmd.Val()
	}
	return ids, nil
}

// meterKeys returns the fault keys of the events at idx.
func (c *cell) meterKeys(idx map[int]bool) map[string]bool {
	out := map[string]bool{}
	for i := range idx {
		e := c.usage.events[i]
		out[meterFaultKey(e.StripeCustomerID, e.Timestamp)] = true
	}
	return out
}

// naiveMeter is the seed's loop sending meter events on the cell's stream,
// with the event id as identifier in naive-identifier mode. rdb nil is the
// cell's Redis.
func (c *cell) naiveMeter(name string, count int64, deferAck bool, sc *stripeapi.Client, rdb redis.UniversalClient) (*naive.MeterConsumer, error) {
	if rdb == nil {
		rdb = c.rdb
	}
	return naive.NewMeterConsumer(naive.MeterConsumerConfig{
		Redis: rdb, Stream: c.stream, Group: c.group, Name: name, Count: count, Block: 50 * time.Millisecond,
		Stripe: sc, Identifier: c.mode == ModeNaiveIdentifier, DeferAck: deferAck, Logger: c.log,
	})
}

// startNaiveMeter runs the given naive meter senders and the seed's
// XAUTOCLAIM monitor, whose consumer-B sends what it reclaims again.
func (c *cell) startNaiveMeter(ctx context.Context, senders ...*naive.MeterConsumer) (*rig, error) {
	plain, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return nil, err
	}
	b, err := c.naiveMeter("consumer-B", 10, false, plain, nil)
	if err != nil {
		return nil, err
	}
	mon, err := naive.NewMonitor(naive.MonitorConfig{
		Redis: c.rdb, Stream: c.stream, Group: c.group, Consumer: "consumer-B",
		MinIdle: c.d.cfg.MinIdle, Handler: b.ProcessClaimed, Logger: c.log,
	})
	if err != nil {
		return nil, err
	}
	r := newRig()
	for _, s := range senders {
		r.loop(ctx, 0, func(ctx context.Context) error { _, err := s.RunOnce(ctx); return err }, c.log)
	}
	r.loop(ctx, 50*time.Millisecond, func(ctx context.Context) error { _, err := mon.RunOnce(ctx); return err }, c.log)
	return r, nil
}

// meterConfig is the meter consumer configuration of a pelguard usage cell.
// rdb nil is the cell's Redis.
func (c *cell) meterConfig(name string, sc consumer.MeterSender, rdb redis.UniversalClient) consumer.MeterConfig {
	if rdb == nil {
		rdb = c.rdb
	}
	cfg := consumer.MeterConfig{
		Redis: rdb, DB: c.pool, Schema: c.schema, Stripe: sc, Stream: c.stream, Group: c.group,
		Name: name, Namespace: namespace, Count: 10, Block: 50 * time.Millisecond, Workers: 4,
		Lease: lease(c.d.cfg.MinIdle), Notifier: c.usage.alerts, Logger: c.log, Clock: c.clk,
	}
	if c.usage.tune != nil {
		c.usage.tune(&cfg)
	}
	return cfg
}

// startPelguardMeter runs pelguard on the meter stream until the rig
// stops: a meter consumer per name ("" is a unique one) with sc, and the
// reaper in place of the naive monitor, which decides each idle entry
// against the meter ledger before any claim and re-drives what it claims
// through the meter consumer's processing, with a Stripe client of its own.
func (c *cell) startPelguardMeter(ctx context.Context, sc consumer.MeterSender, names ...string) (*rig, error) {
	plain, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return nil, err
	}
	rp, err := reaper.New(reaper.Config{
		Redis: c.rdb, DB: c.pool, Schema: c.schema, MeterStripe: plain,
		MeterStreams: []reaper.StreamGroup{{Stream: c.stream, Group: c.group}},
		MinIdle:      c.d.cfg.MinIdle, Interval: 50 * time.Millisecond, Namespace: namespace,
		Lease: lease(c.d.cfg.MinIdle), ConsumerIdle: -1, Notifier: c.usage.alerts, Logger: c.log, Clock: c.clk,
	})
	if err != nil {
		return nil, fmt.Errorf("building the reaper: %w", err)
	}
	r := newRig()
	for _, name := range names {
		if name == "" {
			name = consumer.UniqueName()
		}
		mc, err := consumer.NewMeterConsumer(c.meterConfig(name, sc, nil))
		if err != nil {
			_ = r.stop()
			return nil, fmt.Errorf("building the meter consumer: %w", err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mc.Run(runCtx) }()
		r.stops = append(r.stops, func(stopCtx context.Context) error {
			cancel()
			select {
			case err := <-done:
				return err
			case <-stopCtx.Done():
				return fmt.Errorf("the meter consumer %s did not stop: %w", name, stopCtx.Err())
			}
		})
	}
	if err := rp.Start(ctx); err != nil {
		_ = r.stop()
		return nil, fmt.Errorf("starting the reaper: %w", err)
	}
	r.stops = append(r.stops, rp.Stop)
	return r, nil
}

// processMeterBatches runs msgs through mc ten at a time, as its read loop
// would, and returns the errors (an XACK the drill made fail among them).
func processMeterBatches(ctx context.Context, mc *consumer.MeterConsumer, msgs []redis.XMessage) error {
	var errs []error
	for i := 0; i < len(msgs); i += 10 {
		if _, err := mc.ProcessBatch(ctx, msgs[i:min(i+10, len(msgs))]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// usageState fills a wait's state for a usage cell: meter events recorded
// at the emulator, and (pelguard) the ledger's rows that are settled.
func (c *cell) usageState(ctx context.Context, s *state) error {
	s.charges = int(c.sim.MeterEventCounts().Recorded)
	if c.usage.ledger == nil {
		return nil
	}
	n, err := c.settledRows(ctx)
	if err != nil {
		return err
	}
	s.terminal = n - c.usage.settledBefore
	return nil
}

// settledRows counts the ledger's settled rows (delivered, parked, failed)
// whose timestamps fall among the cell's events'. The schema is shared
// with the usage scenarios run before (settledBefore counts theirs: each
// has drained before the next begins).
func (c *cell) settledRows(ctx context.Context) (int, error) {
	counts, err := c.usage.ledger.Counts(ctx, c.usage.from, c.usage.to)
	if err != nil {
		return 0, fmt.Errorf("counting meter ledger rows: %w", err)
	}
	n := 0
	for st, k := range counts {
		if st != meterledger.StatusSending {
			n += int(k)
		}
	}
	return n, nil
}

// countUsage counts the cell at the emulator: each customer's total from
// the meter's event summaries (Stripe's API, through the adapter) against
// what its events add up to, the events recorded per customer (the
// emulator's own view: Stripe has no API listing them), and pelguard's
// parked events and alerts.
func (c *cell) countUsage(ctx context.Context, res *UsageResult) error {
	want := map[string]int64{}
	wantEvents := map[string]int{}
	for _, e := range c.usage.events {
		want[e.StripeCustomerID] += e.Value
		wantEvents[e.StripeCustomerID]++
	}
	sc, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return err
	}
	*res = UsageResult{Scenario: res.Scenario, Mode: res.Mode, Events: len(c.usage.events), Customers: len(want)}
	for cus, v := range want {
		sums, err := sc.MeterEventSummaries(ctx, c.usage.meterID, cus, c.usage.from, c.usage.to, stripeapi.MeterWindowNone)
		if err != nil {
			return fmt.Errorf("reading Stripe's totals: %w", err)
		}
		var got int64
		for _, s := range sums {
			got += int64(math.Round(s.Value))
		}
		recorded := 0
		for _, e := range c.sim.MeterEvents(meterEventName(c.scenario), cus) {
			if !e.Cancelled {
				recorded++
			}
		}
		res.ExpectedUnits += v
		res.StripeUnits += got
		if got > v {
			res.OverCountUnits += got - v
			res.OverCountedCustomers++
		}
		res.UnderCountUnits += max(0, v-got)
		res.OverCountEvents += max(0, recorded-wantEvents[cus])
	}
	res.Alerted = c.usage.alerts.count()
	res.CallsAfterGap = -1
	if c.usage.callsAtGap >= 0 {
		res.CallsAfterGap = int(c.meterCalls() - c.usage.callsAtGap)
	}
	if !c.usage.deadRead {
		if err := c.readDeadLetters(ctx); err != nil {
			return err
		}
	}
	res.Parked, res.OtherDeadLetters = c.usage.parked, c.usage.otherDead
	return nil
}

// readDeadLetters counts the cell's dead letters: parked events and the
// rest. usage-aof-rollback calls it before its Redis goes away.
func (c *cell) readDeadLetters(ctx context.Context) error {
	dead, err := c.rdb.XRange(ctx, consumer.DeadLetterStream(c.stream), "-", "+").Result()
	if err != nil {
		return fmt.Errorf("reading the dead letters: %w", err)
	}
	c.usage.parked, c.usage.otherDead = 0, 0
	for _, m := range dead {
		if m.Values["reason"] == consumer.ReasonMeterParked {
			c.usage.parked++
		} else {
			c.usage.otherDead++
		}
	}
	c.usage.deadRead = true
	return nil
}

// runUsageCells runs a usage scenario's modes at once, numbered from n+1,
// and returns their results in mode order and their errors.
func (d *drill) runUsageCells(ctx context.Context, scenario string, n, total int) ([]UsageResult, []error) {
	modes := modesOf(scenario)
	res := make([]UsageResult, len(modes))
	errs := make([]error, len(modes))
	var wg sync.WaitGroup
	for i, mode := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = d.runUsageCell(ctx, scenario, mode, n+i+1, total)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s/%s: %w", scenario, mode, errs[i])
			}
		}()
	}
	wg.Wait()
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return res, out
}

// runUsageCell runs one usage scenario in one mode and counts it. A cell
// that cannot finish is in the result with the reason (and the counts it
// reached when they can still be read).
func (d *drill) runUsageCell(ctx context.Context, scenario, mode string, n, total int) (res UsageResult, err error) {
	res = UsageResult{Scenario: scenario, Mode: mode, Events: d.cfg.Events}
	c, cleanup, err := d.newUsageCell(ctx, scenario, mode)
	defer cleanup()
	if err != nil {
		res.Error = redact.String(err.Error())
		d.progress.fail(nil, n, total, scenario, mode, 0, res.Error)
		return res, err
	}
	d.progress.start(c, n, total)
	defer func() {
		if err == nil {
			return
		}
		// Best effort, on a fresh context: an interrupted run has none.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = c.countUsage(cctx, &res)
		res.Error = redact.String(err.Error())
		res.Elapsed = time.Since(c.started)
		d.progress.fail(c, n, total, scenario, mode, res.Elapsed, res.Error)
	}()
	run := map[string]func(context.Context, *cell) error{
		ScenarioUsageInflightReclaim: usageInflightReclaim,
		ScenarioUsagePartialBatch:    usagePartialBatch,
		ScenarioUsageAOFRollback:     usageAOFRollback,
		ScenarioUsage25hGap:          usage25hGap,
	}[scenario]
	if err := run(ctx, c); err != nil {
		return res, err
	}
	d.progress.update(c, "counting at Stripe")
	if err := c.countUsage(ctx, &res); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(c.started)
	d.progress.finishUsage(c, res)
	return res, nil
}
