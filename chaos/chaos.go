// Package chaos is the drill behind `make demo` (cmd/chaos): it reproduces
// the seed's failure modes against real Redis and Postgres and the in-process
// Stripe emulator, once with the seed's naive consumer and XAUTOCLAIM
// monitor (internal/naive) and once with pelguard (consumer + reaper), then
// runs the auditor over each and refunds the naive run's duplicates.
//
// Scenarios:
//   - inflight-reclaim: "reclaim while in flight" (failure mode 1), a Stripe
//     call slower than the monitor's min-idle;
//   - partial-batch: "partial batch" (failure mode 2), COUNT 10 with a timeout
//     part-way, plus a real SIGKILL between the Stripe reply and XACK;
//   - aof-rollback: "AOF rollback" (failure mode 3), a redis-server of the
//     drill's own with appendfsync everysec brought back to an earlier state;
//   - expired-key: a redelivery after Stripe's 24 h idempotency window.
//
// Usage scenarios (usage.go, usagescenarios.go) do the same for usage sent
// to Stripe Billing Meters, in three modes run at once: naive (the seed's
// loop sending meter events without an identifier, and the monitor),
// naive-identifier (the event id as identifier, a duplicate refusal taken
// as delivered, no ledger) and pelguard (the meter consumer and its ledger,
// and the reaper on the meter stream), counting each customer's total from
// the emulator's meter summaries against what its events add up to:
//   - usage-inflight-reclaim, usage-partial-batch, usage-aof-rollback: the
//     three failure modes, for meter events;
//   - usage-25h-gap: replies lost and acks lost, then 25 h pass (the
//     emulator's clock and the ledger's) before the entries are delivered
//     again, past Stripe's identifier window.
//
// usage-busy-customer (busy.go) is usage at volume, a measurement rather
// than a failure mode: one customer sending many events a second beside
// many quiet ones, Stripe answering in 100 ms; the naive senders and
// pelguard's meter consumers, timed and counted at the emulator.
//
// Every run gets its own stream names and Postgres schemas (one per charge
// cell, one shared by the usage scenarios' pelguard cells), removed at the
// end, even when the run fails or is interrupted.
package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Modes. Charge scenarios run naive and pelguard; usage scenarios run all
// three.
const (
	ModeNaive = "naive"
	// ModeNaiveIdentifier is the naive meter sender with a deterministic
	// identifier and no ledger (usage scenarios only).
	ModeNaiveIdentifier = "naive-identifier"
	ModePelguard        = "pelguard"
)

// Scenario names, in the order the drill runs them.
const (
	ScenarioInflightReclaim = "inflight-reclaim"
	ScenarioPartialBatch    = "partial-batch"
	ScenarioAOFRollback     = "aof-rollback"
	ScenarioExpiredKey      = "expired-key"

	ScenarioUsageInflightReclaim = "usage-inflight-reclaim"
	ScenarioUsagePartialBatch    = "usage-partial-batch"
	ScenarioUsageAOFRollback     = "usage-aof-rollback"
	ScenarioUsage25hGap          = "usage-25h-gap"
	// ScenarioUsageBusyCustomer is usage at volume (busy.go).
	ScenarioUsageBusyCustomer = "usage-busy-customer"
)

// Scenario is a scenario with the failure mode it reproduces. Usage
// scenarios send meter events instead of charges; the volume scenario
// (usage-busy-customer) sends meter events too, with a table of its own.
type Scenario struct {
	Name, FailureMode string
	Usage             bool
	Volume            bool
}

// Scenarios lists every scenario, in run order: the charges, then usage.
var Scenarios = []Scenario{
	{ScenarioInflightReclaim, "reclaim while in flight: a Stripe call slower than the monitor's min-idle", false, false},
	{ScenarioPartialBatch, "partial batch: COUNT 10 with a timeout part-way, and a SIGKILL between Stripe reply and XACK", false, false},
	{ScenarioAOFRollback, "AOF rollback: appendfsync everysec loses the last writes, acked entries return as pending", false, false},
	{ScenarioExpiredKey, "expired key: a redelivery after Stripe's 24 h idempotency window", false, false},
	{ScenarioUsageInflightReclaim, "meter events, reclaim while in flight: a meter-event call slower than min-idle", true, false},
	{ScenarioUsagePartialBatch, "meter events, partial batch: COUNT 10, the 7th reply lost, the batch read again", true, false},
	{ScenarioUsageAOFRollback, "meter events, AOF rollback: acked entries return as pending", true, false},
	{ScenarioUsage25hGap, "meter events, 25 h gap: replies and acks lost, redelivered past Stripe's 24 h identifier window", true, false},
	{ScenarioUsageBusyCustomer, "meter events at volume: one customer at 200 events/s beside 50 at 1/s, Stripe answering in 100 ms", false, true},
}

// isUsage reports whether name is a usage scenario.
func isUsage(name string) bool {
	i := slices.IndexFunc(Scenarios, func(x Scenario) bool { return x.Name == name })
	return i >= 0 && Scenarios[i].Usage
}

// isVolume reports whether name is the volume scenario.
func isVolume(name string) bool {
	i := slices.IndexFunc(Scenarios, func(x Scenario) bool { return x.Name == name })
	return i >= 0 && Scenarios[i].Volume
}

// modesOf lists the modes a scenario runs in, in run order.
func modesOf(name string) []string {
	if isVolume(name) {
		return busyModes
	}
	if isUsage(name) {
		return []string{ModeNaive, ModeNaiveIdentifier, ModePelguard}
	}
	return []string{ModeNaive, ModePelguard}
}

// Defaults.
const (
	// DefaultEvents keeps the whole default run well under two minutes on
	// two cores while leaving every scenario enough events to misbehave.
	DefaultEvents = 100
	// DefaultMinIdle is the monitor's (and the reaper's) min-idle, the seed's
	// 60 s scaled down so the drill runs in seconds.
	DefaultMinIdle = 200 * time.Millisecond
	// DefaultSeed makes a run without --seed reproducible.
	DefaultSeed = 1
	// DefaultStallTimeout is how long a scenario may make no progress at
	// all before the drill calls it stuck (at least 10× min-idle).
	DefaultStallTimeout = time.Minute
	// minEvents: partial-batch needs one batch for the killed child and at
	// least one COUNT 10 batch with a 7th event after it.
	minEvents = 20
)

// Config configures a drill run.
type Config struct {
	RedisURL    string // required
	DatabaseURL string // required
	// Events per scenario and mode. Default DefaultEvents.
	Events int
	// Scenarios to run; empty runs all of them.
	Scenarios []string
	// Seed drives the amounts and which events meet a fault; the verdicts
	// must not depend on it.
	Seed int64
	// MinIdle is the naive monitor's and the reaper's min-idle. The slow
	// Stripe call of inflight-reclaim lasts three times as long, and the
	// pelguard lease is chosen so its heartbeat beats it.
	MinIdle time.Duration
	// Executable is the program re-executed as the child that kills itself
	// between Stripe reply and XACK; default os.Executable(). It must call
	// RunChildIfRequested first thing (cmd/chaos's main and the tests'
	// TestMain do).
	Executable string
	// Progress receives a progress line while the drill runs (stderr); nil
	// writes none. ProgressRewrite redraws one line with \r (a terminal).
	Progress        io.Writer
	ProgressRewrite bool
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger

	// Busy sizes usage-busy-customer; zero fields take its defaults.
	Busy BusyConfig

	// Test holds hooks for tests only; the drill leaves it zero.
	Test TestConfig

	// onStart, for tests, learns the run's id (its schemas are
	// chaos_<id>_<n>, its streams chaos:<id>:...) once the services answer.
	onStart func(runID string)
}

// TestConfig holds hooks for tests only.
type TestConfig struct {
	// Deadline, when it returns more than 0 for a cell ("scenario/mode"),
	// replaces that cell's stall timeout and phase limit: a test makes one
	// cell miss its deadline.
	Deadline func(cell string) time.Duration
}

func (c *Config) setDefaults() {
	c.Events = cmp.Or(c.Events, DefaultEvents)
	c.MinIdle = cmp.Or(c.MinIdle, DefaultMinIdle)
	c.Busy.setDefaults()
	if len(c.Scenarios) == 0 {
		c.Scenarios = ScenarioNames()
	}
	// Always the canonical order, whatever the flags' order: tables from
	// different runs line up.
	names := ScenarioNames()
	c.Scenarios = slices.Clone(c.Scenarios)
	slices.SortStableFunc(c.Scenarios, func(a, b string) int {
		return cmp.Compare(slices.Index(names, a), slices.Index(names, b))
	})
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first configuration error, naming the fix.
func (c *Config) Validate() error {
	switch {
	case c.RedisURL == "":
		return errors.New("chaos: a Redis URL is required (REDIS_URL)")
	case c.DatabaseURL == "":
		return errors.New("chaos: a Postgres URL is required (DATABASE_URL)")
	case c.Events < minEvents || c.Events > 10_000:
		return fmt.Errorf("chaos: --events %d must be between %d and 10000", c.Events, minEvents)
	case c.MinIdle < 50*time.Millisecond:
		return fmt.Errorf("chaos: min-idle %s is too short to tell slow from stuck (minimum 50ms)", c.MinIdle)
	}
	if err := c.Busy.validate(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, s := range c.Scenarios {
		if !slices.ContainsFunc(Scenarios, func(x Scenario) bool { return x.Name == s }) {
			return fmt.Errorf("chaos: unknown scenario %q (want one of %s)", s, strings.Join(ScenarioNames(), ", "))
		}
		if seen[s] {
			return fmt.Errorf("chaos: scenario %q given twice", s)
		}
		seen[s] = true
	}
	return nil
}

// ScenarioNames lists the scenario names in run order.
func ScenarioNames() []string {
	var out []string
	for _, s := range Scenarios {
		out = append(out, s.Name)
	}
	return out
}

// Result is one scenario run in one mode. Its JSON form has exactly the
// fields the drill's --json promises.
type Result struct {
	Scenario string `json:"scenario"`
	Mode     string `json:"mode"`
	Events   int    `json:"events"`
	// Charges counts succeeded, unrefunded charges at the emulator when the
	// run ends, before the auditor refunds anything.
	Charges int `json:"charges"`
	// DuplicateCharges and DuplicateCents count every charge beyond the
	// first per (Stripe customer, billing period): money taken twice.
	DuplicateCharges int   `json:"duplicate_charges"`
	DuplicateCents   int64 `json:"duplicate_cents"`
	// Flagged counts the auditor's duplicate_charge findings.
	Flagged int `json:"flagged"`
	// Refunded counts the duplicates `auditor refund` refunded (naive only).
	Refunded int `json:"refunded"`
	// NetDuplicates recounts the emulator's duplicates after the refunds.
	NetDuplicates int `json:"net_duplicates"`
	// Error says why the cell did not finish (a scenario stuck past its
	// deadline, a service gone); its counts are then what it had reached
	// and no verdict about it holds. Empty when it finished.
	Error string `json:"error,omitempty"`

	// OtherFindings counts the auditor's findings that are not duplicates
	// (orphan, missing, mismatch, stuck): none is expected in either mode.
	OtherFindings int `json:"-"`
	// RefundStoppedBy names the auditor's cap that left duplicates open
	// (RefundReport.StoppedBy); the drill lifts every cap, so any is a bug.
	RefundStoppedBy string        `json:"-"`
	Elapsed         time.Duration `json:"-"`
}

// Failed reports whether the cell did not finish.
func (x Result) Failed() bool { return x.Error != "" }

// Skip is a scenario the drill could not run here, with the reason.
type Skip struct {
	Scenario string
	Reason   string
}

// Report is a drill run's outcome.
type Report struct {
	Seed    int64
	Events  int
	Results []Result
	// Usage holds the usage scenarios' cells, the second table.
	Usage []UsageResult
	// Busy holds usage-busy-customer's sides, the third table.
	Busy    []BusyResult
	Skipped []Skip
	Elapsed time.Duration
}

// Failures checks the drill's verdicts and returns every one that does not
// hold, each saying why. An empty slice means the drill passed: naive shows
// duplicates, pelguard none, the auditor flags every duplicate and the
// refunds leave none; and for usage, the naive senders over-count where the
// failure mode makes them, pelguard counts every customer exactly.
func (r Report) Failures() []string {
	var out []string
	for _, x := range r.Results {
		name := x.Scenario + "/" + x.Mode
		if x.Failed() {
			// Its counts are wherever it stopped: only the failure says
			// anything.
			out = append(out, fmt.Sprintf("%s: FAILED, the run is incomplete: %s", name, x.Error))
			continue
		}
		switch x.Mode {
		case ModeNaive:
			if x.DuplicateCharges == 0 {
				out = append(out, name+": the naive code made no duplicate charge, so the drill did not reproduce the failure mode")
			}
		case ModePelguard:
			if x.DuplicateCharges != 0 {
				out = append(out, fmt.Sprintf("%s: pelguard made %d duplicate charge(s) worth %s", name, x.DuplicateCharges, Dollars(x.DuplicateCents)))
			}
			if x.Charges != x.Events {
				out = append(out, fmt.Sprintf("%s: %d events but %d charges: pelguard must charge every event exactly once", name, x.Events, x.Charges))
			}
		}
		if x.Flagged != x.DuplicateCharges {
			out = append(out, fmt.Sprintf("%s: the auditor flagged %d duplicate(s), the emulator holds %d", name, x.Flagged, x.DuplicateCharges))
		}
		if x.NetDuplicates != 0 {
			out = append(out, fmt.Sprintf("%s: %d duplicate(s) left after the refunds", name, x.NetDuplicates))
		}
		if x.RefundStoppedBy != "" {
			out = append(out, fmt.Sprintf("%s: the refund run stopped at the auditor's --%s cap (the drill must lift every cap)", name, x.RefundStoppedBy))
		}
		if x.OtherFindings != 0 {
			out = append(out, fmt.Sprintf("%s: the auditor reported %d finding(s) other than duplicates", name, x.OtherFindings))
		}
	}
	out = append(out, r.usageFailures()...)
	out = append(out, r.busyFailures()...)
	if len(r.Results) == 0 && len(r.Usage) == 0 && len(r.Busy) == 0 {
		out = append(out, "no scenario ran")
	}
	return out
}

// Dollars formats minor units as dollars.
func Dollars(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s$%d.%02d", sign, cents/100, cents%100)
}

// Incomplete reports whether a cell did not finish.
func (r Report) Incomplete() bool {
	return slices.ContainsFunc(r.Results, Result.Failed) || slices.ContainsFunc(r.Usage, UsageResult.Failed) ||
		slices.ContainsFunc(r.Busy, BusyResult.Failed)
}

// Run runs the configured scenarios, each in its modes (a usage scenario's
// three at once), and audits the charge ones.
// A cell that cannot be carried out (a scenario stuck past its deadline, a
// service down) is in the report as a failed row and the others still run
// (each cell has its own stream, schema and emulator); Run then also returns
// every such error. An interrupted run (ctx) stops at once. The verdicts are
// Report.Failures. Everything it created is removed before it returns, also
// when ctx is cancelled.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	start := time.Now()
	rep := Report{Seed: cfg.Seed, Events: cfg.Events}
	d, err := newDrill(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer d.close()
	d.prep = d.prepareUsageSchema(ctx, cfg.Scenarios)
	defer d.prep.wait() // before d.close drops the schemas
	if cfg.onStart != nil {
		cfg.onStart(d.runID)
	}

	total := 0
	for _, sc := range cfg.Scenarios {
		total += len(modesOf(sc))
	}
	n := 0
	var errs []error
	for _, sc := range cfg.Scenarios {
		if sc == ScenarioAOFRollback || sc == ScenarioUsageAOFRollback {
			if why := redisServerMissing(); why != "" {
				rep.Skipped = append(rep.Skipped, Skip{Scenario: sc, Reason: why})
				d.progress.note(fmt.Sprintf("SKIPPED %s: %s", sc, why))
				total -= len(modesOf(sc))
				continue
			}
		}
		if isVolume(sc) {
			// Both sides at once, on the same production.
			res, cellErrs := d.runBusyCells(ctx, sc, n, total)
			n += len(res)
			if ctx.Err() != nil {
				rep.Elapsed = time.Since(start)
				return rep, fmt.Errorf("%s: %w", sc, errors.Join(append(cellErrs, ctx.Err())...))
			}
			rep.Busy = append(rep.Busy, res...)
			errs = append(errs, cellErrs...)
			continue
		}
		if isUsage(sc) {
			// A usage scenario's three modes run at once: each cell has
			// its own stream and emulator (and Redis server), only the
			// pelguard cell uses the database, and most of a cell's time
			// is spent waiting for min-idle, a slow call or a lost reply,
			// so the drill's time stays small.
			res, cellErrs := d.runUsageCells(ctx, sc, n, total)
			n += len(res)
			if ctx.Err() != nil {
				// Interrupted: no row, the run is not a report.
				rep.Elapsed = time.Since(start)
				return rep, fmt.Errorf("%s: %w", sc, errors.Join(append(cellErrs, ctx.Err())...))
			}
			rep.Usage = append(rep.Usage, res...)
			errs = append(errs, cellErrs...)
			continue
		}
		for _, mode := range modesOf(sc) {
			n++
			res, err := d.runCell(ctx, sc, mode, n, total)
			if err != nil && ctx.Err() != nil {
				// Interrupted: no row, the run is not a report.
				rep.Elapsed = time.Since(start)
				return rep, fmt.Errorf("%s/%s: %w", sc, mode, err)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s/%s: %w", sc, mode, err))
			}
			rep.Results = append(rep.Results, res)
		}
	}
	rep.Elapsed = time.Since(start)
	d.progress.done()
	return rep, errors.Join(errs...)
}
