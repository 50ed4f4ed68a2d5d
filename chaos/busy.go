package chaos

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// The busy-customer scenario (usage at volume): one customer sends many
// usage events a second beside many quiet customers, Stripe answers each
// meter-event call in 100 ms, and two consumers send on each side. It is
// not a failure mode but a measurement: how far behind Stripe's count each
// customer is when production ends, and how long until everything is
// counted. Both sides get the same events at the same moments, each on its
// own stream and emulator:
//   - naive-identifier: two of the naive meter senders (internal/naive: one
//     call per event, in stream order, the event id as identifier and a
//     duplicate refusal taken as delivered) and the XAUTOCLAIM monitor whose
//     consumer-B re-sends what stays pending (a call Stripe refused because
//     the other sender's call for the same customer was in flight);
//   - pelguard: two meter consumers that record each event in the ledger and
//     ack it, and send from the ledger, one call per customer, meter and
//     timestamp second (the sum of that second's events), and the reaper.

// BusyConfig sizes the busy-customer scenario; zero fields take the
// defaults.
type BusyConfig struct {
	// Rate is the busy customer's events per second. Default 200.
	Rate int
	// For is how long the events are produced. Default 20 s.
	For time.Duration
	// Quiet is the number of quiet customers, each sending QuietRate events
	// per second. Defaults 50 and 1.
	Quiet     int
	QuietRate int
	// Latency is how long the emulator takes to answer a meter-event call
	// (Stripe's concurrency rule holds the customer's slot meanwhile).
	// Default 100 ms.
	Latency time.Duration
	// After: the busy customer's count is read when production ends and
	// again this long after. Default 10 s.
	After time.Duration
	// Bound is how long after production the drill waits for every event
	// to be counted. Default 40 s.
	Bound time.Duration
}

func (b *BusyConfig) setDefaults() {
	b.Rate = cmp.Or(b.Rate, 200)
	b.For = cmp.Or(b.For, 20*time.Second)
	b.Quiet = cmp.Or(b.Quiet, 50)
	b.QuietRate = cmp.Or(b.QuietRate, 1)
	b.Latency = cmp.Or(b.Latency, 100*time.Millisecond)
	b.After = cmp.Or(b.After, 10*time.Second)
	b.Bound = max(cmp.Or(b.Bound, 40*time.Second), b.After)
}

func (b BusyConfig) validate() error {
	switch {
	case b.Rate < 1 || b.Rate > 5000 || b.QuietRate < 1 || b.QuietRate > 100:
		return fmt.Errorf("chaos: the busy customer's rate %d/s must be 1-5000 and the quiet ones' %d/s 1-100", b.Rate, b.QuietRate)
	case b.Quiet < 1 || b.Quiet > 1000:
		return fmt.Errorf("chaos: %d quiet customers: want 1-1000", b.Quiet)
	case b.For < time.Second || b.For > 5*time.Minute || b.Bound > 10*time.Minute:
		return fmt.Errorf("chaos: the busy-customer production of %s must last 1s-5m and its bound %s at most 10m", b.For, b.Bound)
	}
	return nil
}

// busyCustomer is the busy customer's Stripe id; quiet ones are
// cus_quiet<n>.
const busyCustomer = "cus_busy"

func quietCustomer(i int) string { return fmt.Sprintf("cus_quiet%03d", i) }

// BusyResult is one side of the busy-customer scenario, counted at the
// emulator (each event is one unit of a sum meter, so units are events).
// Its JSON form has exactly these fields.
type BusyResult struct {
	Scenario string `json:"scenario"`
	Mode     string `json:"mode"`
	// ProductionSeconds is how long events were produced; Produced how
	// many (the busy customer's BusyProduced of them).
	ProductionSeconds float64 `json:"production_seconds"`
	// BusyRate and QuietRate are the busy and each quiet customer's events
	// per second; LatencyMS how long Stripe took to answer a call.
	BusyRate     int   `json:"busy_rate"`
	QuietRate    int   `json:"quiet_rate"`
	LatencyMS    int64 `json:"stripe_latency_ms"`
	Produced     int   `json:"produced"`
	BusyProduced int   `json:"busy_produced"`
	// Counted is what Stripe counts when the drill stopped waiting (all
	// counted, or the bound passed); OverCounted what it counts beyond the
	// events, per customer, once the senders stopped.
	Counted     int64 `json:"counted"`
	OverCounted int64 `json:"overcounted"`
	// BusyAtEnd is the busy customer's count when production ended;
	// BusyAfter AfterSeconds later.
	BusyAtEnd    int64   `json:"busy_counted_at_end"`
	BusyAfter    int64   `json:"busy_counted_after"`
	AfterSeconds float64 `json:"after_seconds"`
	// QuietShortAtEnd counts the quiet customers Stripe counted fewer
	// events than they had sent when production ended, of QuietCustomers;
	// QuietShortAtStop when the drill stopped waiting.
	// QuietMissingAtEnd is how many of their events were not counted then.
	QuietCustomers    int `json:"quiet_customers"`
	QuietShortAtEnd   int `json:"quiet_short_at_end"`
	QuietMissingAtEnd int `json:"quiet_missing_at_end"`
	QuietShortAtStop  int `json:"quiet_short_at_stop"`
	// CaughtUpSeconds is how long after production every event was counted;
	// -1: not within BoundSeconds.
	CaughtUpSeconds float64 `json:"caught_up_seconds"`
	BoundSeconds    float64 `json:"bound_seconds"`
	// StripeCalls counts the meter-event calls Stripe answered; Refused
	// those it refused (a call for the same customer and meter in flight,
	// a repeated identifier, a rate limit).
	// BusyCalls counts the calls Stripe recorded for the busy customer.
	StripeCalls int64 `json:"stripe_calls"`
	Refused     int64 `json:"refused_calls"`
	BusyCalls   int   `json:"busy_calls"`
	// Backlog counts the stream entries not yet acknowledged (pending or
	// never read) when the drill stopped waiting.
	Backlog int64 `json:"backlog_at_stop"`
	// Error says why the side did not finish its run; empty when it did.
	Error string `json:"error,omitempty"`

	Elapsed time.Duration `json:"-"`
	// Series is what was sent and counted, about every second from the
	// start of production (the HTML report's chart).
	Series []BusyPoint `json:"-"`
}

// BusyPoint is a moment of usage-busy-customer: events sent and counted
// at Stripe so far, in all and for the busy customer.
type BusyPoint struct {
	Seconds                float64
	Produced, BusyProduced int
	Counted, BusyCounted   int64
}

// Failed reports whether the side did not finish its run.
func (x BusyResult) Failed() bool { return x.Error != "" }

// CaughtUp reports whether every event was counted within the bound.
func (x BusyResult) CaughtUp() bool { return x.CaughtUpSeconds >= 0 }

// busyFailures checks the busy-customer verdicts: pelguard counts every
// event exactly once within the bound; the naive senders do not catch up
// within it (else the drill did not reproduce the backlog); no side
// counts an event twice.
func (r Report) busyFailures() []string {
	var out []string
	for _, x := range r.Busy {
		name := x.Scenario + "/" + x.Mode
		if x.Failed() {
			out = append(out, fmt.Sprintf("%s: FAILED, the run is incomplete: %s", name, x.Error))
			continue
		}
		if x.OverCounted != 0 {
			out = append(out, fmt.Sprintf("%s: Stripe counts %d event(s) more than were sent", name, x.OverCounted))
		}
		switch x.Mode {
		case ModePelguard:
			if !x.CaughtUp() || x.Counted != int64(x.Produced) {
				out = append(out, fmt.Sprintf("%s: pelguard had %d of %d events counted %gs after production: every event must be counted within the bound",
					name, x.Counted, x.Produced, x.BoundSeconds))
			}
		default:
			if x.CaughtUp() {
				out = append(out, fmt.Sprintf("%s: the naive senders caught up within %gs, so the drill did not reproduce the backlog", name, x.BoundSeconds))
			}
		}
	}
	return out
}

// busyModes are the sides of the busy-customer scenario.
var busyModes = []string{ModeNaiveIdentifier, ModePelguard}

// busySide is one side's cell and what the drill measured of it.
type busySide struct {
	c *cell
	r *rig
	// cancel ends the side's work in flight when the drill stops waiting:
	// the naive monitor's consumer-B would otherwise work through a
	// reclaimed batch of a hundred calls first. Its counts are read before.
	cancel context.CancelFunc
	res    BusyResult
	err    error
	done   bool
	totals map[string]int64
}

// runBusyCells runs the busy-customer scenario's sides at once, numbered
// from n+1, on the same production, and returns their results in mode
// order and their errors.
func (d *drill) runBusyCells(ctx context.Context, scenario string, n, total int) ([]BusyResult, []error) {
	b := d.cfg.Busy
	sides := make([]*busySide, len(busyModes))
	var cleanups []func()
	defer func() {
		for _, f := range cleanups {
			f()
		}
	}()
	for i, mode := range busyModes {
		s := &busySide{res: BusyResult{Scenario: scenario, Mode: mode, QuietCustomers: b.Quiet, CaughtUpSeconds: -1,
			BusyRate: b.Rate, QuietRate: b.QuietRate, LatencyMS: b.Latency.Milliseconds(),
			BoundSeconds: b.Bound.Seconds(), AfterSeconds: b.After.Seconds()}}
		sides[i] = s
		c, cleanup, err := d.newBusyCell(ctx, scenario, mode)
		cleanups = append(cleanups, cleanup)
		if err != nil {
			s.err = err
			d.progress.fail(nil, n+i+1, total, scenario, mode, 0, redact.String(err.Error()))
			continue
		}
		s.c = c
		d.progress.start(c, n+i+1, total)
		sctx, cancel := context.WithCancel(ctx)
		s.cancel = cancel
		if s.r, err = c.startBusySenders(sctx); err != nil {
			s.err = err
		}
	}
	p := d.runBusy(ctx, sides)
	// Stop both sides at once; the naive one without finishing its calls
	// (pelguard has nothing left in flight once everything is counted).
	var wg sync.WaitGroup
	for _, s := range sides {
		if s.r == nil {
			continue
		}
		if s.res.Mode != ModePelguard || !s.done {
			s.cancel()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.r.stop(); err != nil && s.err == nil && s.res.Mode == ModePelguard && s.done {
				s.err = err
			}
		}()
	}
	wg.Wait()
	var out []BusyResult
	var errs []error
	for _, s := range sides {
		if s.cancel != nil {
			s.cancel()
		}
		if s.c != nil && s.err == nil {
			s.countBusy(p)
		}
		if s.c != nil {
			s.res.Elapsed = time.Since(s.c.started)
		}
		if s.err != nil {
			s.res.Error = redact.String(s.err.Error())
			errs = append(errs, fmt.Errorf("%s/%s: %w", scenario, s.res.Mode, s.err))
			if s.c != nil {
				d.progress.fail(s.c, 0, 0, scenario, s.res.Mode, s.res.Elapsed, s.res.Error)
			}
		} else {
			d.progress.finishBusy(s.c, s.res)
		}
		out = append(out, s.res)
	}
	return out, errs
}

// newBusyCell sets up a side: its stream, an emulator answering meter
// events in Latency with the scenario's sum meter, and for pelguard the
// usage scenarios' schema (it runs after the other usage scenarios: its
// consumers fence that ledger against per-event sends).
func (d *drill) newBusyCell(ctx context.Context, scenario, mode string) (*cell, func(), error) {
	c, cleanup, err := d.usageCellOf(ctx, scenario, mode, stripesim.Faults{MeterEventLatency: d.cfg.Busy.Latency})
	if err != nil {
		return nil, cleanup, err
	}
	if mode == ModePelguard {
		// As deployed: the consumer's default batch, workers and pipeline,
		// sending from the ledger, the meter's events of one second summed.
		c.usage.tune = func(mc *consumer.MeterConfig) {
			mc.Count, mc.Workers, mc.Pipeline = 0, 0, 0
			mc.SendFromLedger = true
			mc.AggregateMeters = []string{meterEventName(scenario)}
		}
	}
	if err := consumer.EnsureGroup(ctx, c.rdb, c.stream, c.group); err != nil {
		return nil, cleanup, err
	}
	return c, cleanup, nil
}

// startBusySenders starts a side's two senders and its monitor (naive) or
// reaper (pelguard).
func (c *cell) startBusySenders(ctx context.Context) (*rig, error) {
	sc, err := c.stripe(stripeapi.ModePaymentIntents, nil)
	if err != nil {
		return nil, err
	}
	if c.mode == ModePelguard {
		return c.startPelguardMeter(ctx, sc, "", "")
	}
	var senders []*naive.MeterConsumer
	for i := range 2 {
		s, err := c.naiveMeter(fmt.Sprintf("worker-%d", i+1), 1, false, sc, nil)
		if err != nil {
			return nil, err
		}
		senders = append(senders, s)
	}
	return c.startNaiveMeter(ctx, senders...)
}

// produced is what the producer has put on every side's stream, per
// Stripe customer.
type produced struct {
	total, quiet int
	by           map[string]int
}

// runBusy produces the events on every live side's stream at once, then
// watches each side's counts at its emulator until every side has all
// counted (and After has passed) or Bound has passed.
func (d *drill) runBusy(ctx context.Context, sides []*busySide) produced {
	b := d.cfg.Busy
	var live []*busySide
	for _, s := range sides {
		if s.err == nil {
			live = append(live, s)
		}
	}
	p := produced{by: map[string]int{}}
	if len(live) == 0 {
		return p
	}
	for _, s := range live {
		d.progress.update(s.c, fmt.Sprintf("producing: one customer at %d events/s, %d at %d/s, for %s", b.Rate, b.Quiet, b.QuietRate, b.For))
	}
	start := time.Now()
	seq := 0
	nextPoint := time.Second
	for tick := time.NewTicker(50 * time.Millisecond); ; {
		el := min(time.Since(start), b.For)
		busyWant := int(int64(b.Rate) * int64(el) / int64(time.Second))
		quietWant := int(int64(b.Quiet*b.QuietRate) * int64(el) / int64(time.Second))
		var evs []event.MeterEvent
		now := time.Now().UTC()
		for ; p.by[busyCustomer] < busyWant; p.by[busyCustomer]++ {
			evs = append(evs, busyEvent(busyCustomer, now, seq))
			seq++
		}
		for ; p.quiet < quietWant; p.quiet++ {
			cus := quietCustomer(p.quiet % b.Quiet)
			evs = append(evs, busyEvent(cus, now, seq))
			seq++
			p.by[cus]++
		}
		p.total += len(evs)
		if err := publishTo(ctx, live, evs); err != nil {
			for _, s := range live {
				s.err = err
			}
			tick.Stop()
			return p
		}
		if el >= nextPoint {
			nextPoint += time.Second
			for _, s := range live {
				s.measure(p)
				s.point(el, p)
			}
		}
		if el >= b.For {
			tick.Stop()
			break
		}
		select {
		case <-ctx.Done():
			tick.Stop()
			for _, s := range live {
				s.err = ctx.Err()
			}
			return p
		case <-tick.C:
		}
	}
	ended := time.Now()
	for _, s := range live {
		s.res.ProductionSeconds = ended.Sub(start).Seconds()
		s.res.Produced, s.res.BusyProduced = p.total, p.by[busyCustomer]
		s.measure(p)
		s.res.BusyAtEnd = s.totals[busyCustomer]
		s.res.QuietShortAtEnd, s.res.QuietMissingAtEnd = s.quietShort(p), s.quietMissing(p)
	}
	afterRead := false
	prod := ended.Sub(start)
	nextPoint = prod.Truncate(time.Second) + time.Second
	for {
		since := time.Since(ended)
		if at := prod + since; at >= nextPoint {
			nextPoint += time.Second
			for _, s := range live {
				s.measure(p)
				s.point(at, p)
			}
		}
		all := true
		for _, s := range live {
			if s.done {
				continue
			}
			s.measure(p)
			if s.counted() == int64(p.total) && s.quietShort(p) == 0 && s.totals[busyCustomer] >= int64(p.by[busyCustomer]) {
				s.done = true
				s.res.CaughtUpSeconds = since.Seconds()
				d.progress.update(s.c, fmt.Sprintf("every event counted %.1fs after production", since.Seconds()))
				continue
			}
			all = false
			d.progress.update(s.c, fmt.Sprintf("%d of %d events counted, %.0fs after production", s.counted(), p.total, since.Seconds()))
		}
		if !afterRead && since >= b.After {
			afterRead = true
			for _, s := range live {
				s.res.BusyAfter = s.c.sim.MeterTotal(meterEventName(s.c.scenario), busyCustomer)
			}
		}
		if (all && afterRead) || since >= b.Bound {
			break
		}
		select {
		case <-ctx.Done():
			for _, s := range live {
				s.err = ctx.Err()
			}
			return p
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, s := range live {
		if !s.done {
			s.measure(p)
		}
		s.res.Counted = s.counted()
		s.res.QuietShortAtStop = s.quietShort(p)
		s.res.Backlog, s.err = s.c.backlog(ctx)
	}
	return p
}

// point adds what the side's emulator counts at el since production began
// to its series (the HTML report's chart).
func (s *busySide) point(el time.Duration, p produced) {
	s.res.Series = append(s.res.Series, BusyPoint{Seconds: el.Seconds(), Produced: p.total, Counted: s.counted(),
		BusyProduced: p.by[busyCustomer], BusyCounted: s.totals[busyCustomer]})
}

// busyEvent is one usage event of customer, one unit of the scenario's meter.
func busyEvent(customer string, ts time.Time, seq int) event.MeterEvent {
	return event.MeterEvent{EventName: meterEventName(ScenarioUsageBusyCustomer), CustomerID: customer[len("cus_"):],
		StripeCustomerID: customer, Value: 1, Timestamp: ts, EventID: fmt.Sprintf("ev-%d", seq)}
}

// publishTo puts evs on every side's stream, as their producer would.
func publishTo(ctx context.Context, sides []*busySide, evs []event.MeterEvent) error {
	if len(evs) == 0 {
		return nil
	}
	pipe := sides[0].c.rdb.Pipeline()
	for _, s := range sides {
		for _, e := range evs {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.c.stream, Values: map[string]any{"payload": e.Payload()}})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("publishing %d meter events: %w", len(evs), err)
	}
	return nil
}

// measure reads every customer's total at the side's emulator.
func (s *busySide) measure(p produced) {
	if s.totals == nil {
		s.totals = map[string]int64{}
	}
	for cus := range p.by {
		s.totals[cus] = s.c.sim.MeterTotal(meterEventName(s.c.scenario), cus)
	}
}

func (s *busySide) counted() int64 {
	var n int64
	for _, v := range s.totals {
		n += v
	}
	return n
}

// quietShort counts the quiet customers whose total is below what they sent.
func (s *busySide) quietShort(p produced) int {
	n := 0
	for cus, want := range p.by {
		if cus != busyCustomer && s.totals[cus] < int64(want) {
			n++
		}
	}
	return n
}

// quietMissing counts the quiet customers' events not counted yet.
func (s *busySide) quietMissing(p produced) int {
	n := 0
	for cus, want := range p.by {
		if cus != busyCustomer {
			n += max(0, want-int(s.totals[cus]))
		}
	}
	return n
}

// backlog counts the stream's entries not yet acknowledged: pending or
// never delivered.
func (c *cell) backlog(ctx context.Context) (int64, error) {
	st, err := c.state(ctx)
	if err != nil {
		return 0, err
	}
	return st.pending + max(st.lag, 0), nil
}

// countBusy counts a side once its senders stopped: the calls Stripe
// answered and refused, and what it counts beyond each customer's events.
func (s *busySide) countBusy(p produced) {
	c := s.c
	n := c.sim.MeterEventCounts()
	s.res.StripeCalls = c.meterCalls()
	s.res.Refused = n.Duplicates + n.Concurrent + n.RateLimited + n.Invalid + n.Rejected
	s.res.BusyCalls = len(c.sim.MeterEvents(meterEventName(c.scenario), busyCustomer))
	s.res.OverCounted = 0
	for cus, want := range p.by {
		s.res.OverCounted += max(0, c.sim.MeterTotal(meterEventName(c.scenario), cus)-int64(want))
	}
}
