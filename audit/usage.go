package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Usage reconciliation (issue 29): Stripe has no list of meter events, only
// event summaries per meter and named customer, grouped by hour or UTC day
// and eventually consistent. So the auditor compares totals: per meter,
// Stripe customer and window, Stripe's summary against the ledger's
// delivered total (meter_events, aggregated in SQL into usage_stage). A
// window is compared once it ended SettleDelay ago, and a difference
// becomes a finding (usage_over, usage_under) only once StableChecks
// consecutive runs saw the very same difference: a summary that is merely
// behind catches up in between. Findings re-evaluate every run and resolve
// themselves when the totals agree. Corrections: usage_correct.go.

// Defaults of UsageConfig.
const (
	// DefaultUsageSettleDelay: a window is compared once it ended this long
	// ago. Stripe documents summaries as eventually consistent without a
	// bound; an hour is ample for what is seen in practice (seconds to
	// minutes), and StableChecks guards the rest.
	DefaultUsageSettleDelay = time.Hour
	// DefaultUsageStableChecks: consecutive runs that must see the same
	// difference before it is a finding.
	DefaultUsageStableChecks = 2
	// DefaultUsageHourlyFor: windows of the last two days (from the UTC
	// midnight before now minus this) are compared per hour, older ones per
	// UTC day (one request per customer and meter covers them all).
	DefaultUsageHourlyFor = 48 * time.Hour
	// DefaultUsageLookback: Stripe takes events up to 35 days old, and the
	// ledger keeps them 36: the whole days inside it are compared.
	DefaultUsageLookback = 35 * 24 * time.Hour
	// DefaultUsageCustomerPage: customers staged windows are read for at a
	// time.
	DefaultUsageCustomerPage = 1000
	// DefaultUsageMaxCorrections and DefaultUsageMaxUnits cap one run's
	// corrections; DefaultUsageMaxCorrections24h every correction of any
	// 24 h (usage_corrections).
	DefaultUsageMaxCorrections    = 10
	DefaultUsageMaxUnits          = 100_000
	DefaultUsageMaxCorrections24h = 30
	// DefaultUsageInvoiceGrace is Stripe's default invoice finalization
	// grace period (documented: one hour, during which usage of the ended
	// period is still taken).
	DefaultUsageInvoiceGrace = time.Hour
	// DefaultUsageMaxWindowCorrections: corrections one window may get over
	// its life (a window that keeps drifting is a person's to look at).
	DefaultUsageMaxWindowCorrections = 3
	// DefaultUsageMaxResendEvents bounds the events of one window an
	// under-count correction sends again.
	DefaultUsageMaxResendEvents = 1000
)

// UsageConfig configures the usage reconciliation (Config.Usage).
type UsageConfig struct {
	// Enabled runs the reconciliation after every scheduled audit run.
	// ReconcileUsage runs it whatever this says.
	Enabled bool
	// SettleDelay: windows are compared once they ended this long ago
	// (default DefaultUsageSettleDelay).
	SettleDelay time.Duration
	// StableChecks: runs in a row that must see one difference before it
	// is a finding (default DefaultUsageStableChecks; 1 reports at once).
	StableChecks int
	// HourlyFor: windows from the UTC midnight before now minus HourlyFor
	// are compared per hour, older ones per day (default
	// DefaultUsageHourlyFor; at least 24 h).
	HourlyFor time.Duration
	// Lookback: how far back windows are compared (default and most
	// DefaultUsageLookback).
	Lookback time.Duration
	// CustomerPage: customers read from the stage at a time.
	CustomerPage int

	// AutoCorrect makes the corrections Stripe allows at the finding's age
	// (usage_correct.go), within the caps below; without it a finding only
	// names the correction.
	AutoCorrect       bool
	MaxCorrections    int
	MaxUnits          int64
	MaxCorrections24h int
	// MaxWindowCorrections: corrections one window may get over its life
	// (default DefaultUsageMaxWindowCorrections); a window that drifts
	// again after them is named for a person. A window's next correction
	// is decided only once its last was sent more than SettleDelay ago.
	MaxWindowCorrections int
	// SafeWindow is how long after an event's first attempt Stripe still
	// refuses its identifier again (default meterledger's 23 h): an
	// under-count is re-sent under the events' own identifiers only within
	// it.
	SafeWindow time.Duration
	// InvoiceGrace is the invoices' finalization grace period (default
	// DefaultUsageInvoiceGrace): a correction lands on the invoice of the
	// window's billing period only until the period's end plus it.
	InvoiceGrace time.Duration
	// InvoiceClosesAt says when the invoice that bills customer's usage at
	// ts is finalized. Default: billing periods are calendar months (UTC),
	// closed at the next month's start plus InvoiceGrace. Teams whose
	// subscriptions renew on other days give their own.
	InvoiceClosesAt func(customer string, ts time.Time) time.Time
	// MaxResendEvents bounds the events of one window an under-count
	// correction re-sends (default DefaultUsageMaxResendEvents); a window
	// with more is left to a person.
	MaxResendEvents int
}

func (u UsageConfig) withDefaults() UsageConfig {
	u.SettleDelay = cmp.Or(u.SettleDelay, DefaultUsageSettleDelay)
	u.StableChecks = cmp.Or(u.StableChecks, DefaultUsageStableChecks)
	u.HourlyFor = cmp.Or(u.HourlyFor, DefaultUsageHourlyFor)
	u.Lookback = cmp.Or(u.Lookback, DefaultUsageLookback)
	u.CustomerPage = cmp.Or(u.CustomerPage, DefaultUsageCustomerPage)
	u.MaxCorrections = cmp.Or(u.MaxCorrections, DefaultUsageMaxCorrections)
	u.MaxUnits = cmp.Or(u.MaxUnits, DefaultUsageMaxUnits)
	u.MaxCorrections24h = cmp.Or(u.MaxCorrections24h, DefaultUsageMaxCorrections24h)
	u.MaxWindowCorrections = cmp.Or(u.MaxWindowCorrections, DefaultUsageMaxWindowCorrections)
	u.SafeWindow = cmp.Or(u.SafeWindow, meterledger.DefaultSafeWindow)
	u.InvoiceGrace = cmp.Or(u.InvoiceGrace, DefaultUsageInvoiceGrace)
	u.MaxResendEvents = cmp.Or(u.MaxResendEvents, DefaultUsageMaxResendEvents)
	if u.InvoiceClosesAt == nil {
		grace := u.InvoiceGrace
		u.InvoiceClosesAt = func(_ string, ts time.Time) time.Time {
			y, m, _ := ts.UTC().Date()
			return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Add(grace)
		}
	}
	return u
}

// Validate reports settings the reconciliation cannot work with.
func (u UsageConfig) Validate() error {
	var errs []error
	// Each setting is named as pelguard-auditor's flag for it, which is
	// what an operator typed; the few without a flag by their field.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"--usage-settle-delay", u.SettleDelay}, {"--usage-invoice-grace", u.InvoiceGrace}} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s %s: want 0 or more", d.name, d.d))
		}
	}
	if u.HourlyFor != 0 && u.HourlyFor < 24*time.Hour {
		errs = append(errs, fmt.Errorf("--usage-hourly-for %s: want at least 24h", u.HourlyFor))
	}
	if u.Lookback < 0 || u.Lookback > DefaultUsageLookback {
		errs = append(errs, fmt.Errorf("Lookback %s: want at most %s (Stripe's 35 days)", u.Lookback, DefaultUsageLookback))
	}
	if u.SettleDelay >= 24*time.Hour {
		errs = append(errs, fmt.Errorf("--usage-settle-delay %s: want less than 24h", u.SettleDelay))
	}
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"--usage-stable-checks", int64(u.StableChecks)}, {"CustomerPage", int64(u.CustomerPage)},
		{"--usage-max-corrections", int64(u.MaxCorrections)}, {"--usage-max-units", u.MaxUnits},
		{"--usage-max-corrections-24h", int64(u.MaxCorrections24h)}, {"--usage-max-window-corrections", int64(u.MaxWindowCorrections)},
		{"--usage-max-resend-events", int64(u.MaxResendEvents)},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d: want 0 (the default) or more", n.name, n.v))
		}
	}
	if u.SafeWindow < 0 || u.SafeWindow >= stripeapi.MeterIdentifierWindow {
		errs = append(errs, fmt.Errorf("SafeWindow %s: want 0 (the default) up to less than Stripe's identifier window (%s)", u.SafeWindow, stripeapi.MeterIdentifierWindow))
	}
	return errors.Join(errs...)
}

// UsageKind is what a usage finding says.
type UsageKind string

// The usage finding kinds.
const (
	// UsageOver: Stripe counts more than the ledger delivered (another
	// sender, a re-send past the identifier window).
	UsageOver UsageKind = "usage_over"
	// UsageUnder: Stripe counts less (an event rejected after its 200).
	UsageUnder UsageKind = "usage_under"
)

// UsageFinding is one row of usage_findings.
type UsageFinding struct {
	ID               int64     `json:"id"`
	Kind             UsageKind `json:"kind"`
	State            string    `json:"state"` // suspect, open, resolved, dismissed
	EventName        string    `json:"event_name"`
	MeterID          string    `json:"meter_id"`
	StripeCustomerID string    `json:"stripe_customer_id"`
	WindowStart      time.Time `json:"window_start"`
	WindowEnd        time.Time `json:"window_end"`
	// Measure is what was compared: "sum" (the meter's units) or "count"
	// (events).
	Measure     string `json:"measure"`
	LedgerValue int64  `json:"ledger_value"`
	StripeValue int64  `json:"stripe_value"`
	Checks      int    `json:"checks"`
	// Resolution says why a run resolved it; ManualAction the correction a
	// person must make when pelguard may not make it.
	Resolution   string `json:"resolution,omitempty"`
	ManualAction string `json:"manual_action,omitempty"`
	// UnknownLow and UnknownHigh bound what the window's events of unknown
	// outcome (and its corrections not confirmed) may add to the ledger's
	// value at Stripe: Stripe's value differs only outside [LedgerValue +
	// UnknownLow, LedgerValue + UnknownHigh]. Unknown names those events
	// and what a person should check.
	UnknownLow  int64  `json:"unknown_low,omitempty"`
	UnknownHigh int64  `json:"unknown_high,omitempty"`
	Unknown     string `json:"unknown,omitempty"`
	// Early: the window was compared before its delivery settled, as its
	// invoice closes first; a person looks, nothing is corrected.
	Early string `json:"early,omitempty"`
	// New marks, in a run's report, a finding that became open in it.
	New bool `json:"new,omitempty"`
}

// Delta is the part of Stripe's value outside the ledger's interval
// [LedgerValue + UnknownLow, LedgerValue + UnknownHigh]: positive for
// usage_over, negative for usage_under, 0 inside. Only that part is ever
// corrected: units that may be pelguard's own are never taken back, and
// never sent again.
func (f UsageFinding) Delta() int64 {
	switch {
	case f.StripeValue > f.LedgerValue+f.UnknownHigh:
		return f.StripeValue - f.LedgerValue - f.UnknownHigh
	case f.StripeValue < f.LedgerValue+f.UnknownLow:
		return f.StripeValue - f.LedgerValue - f.UnknownLow
	}
	return 0
}

// UsageReport is what one reconciliation run did.
type UsageReport struct {
	RunID int64 `json:"run_id"`
	// Windows [DailyFrom, HourlyFrom) were compared per UTC day,
	// [HourlyFrom, To) per hour.
	DailyFrom  time.Time `json:"daily_from"`
	HourlyFrom time.Time `json:"hourly_from"`
	To         time.Time `json:"to"`
	// Meters compared; Skipped says, per event name, why one was not.
	Meters  []string          `json:"meters"`
	Skipped map[string]string `json:"skipped,omitempty"`
	// Customers counts the (meter, customer) pairs compared, Requests the
	// summary requests made, WindowsCompared the windows with usage on
	// either side.
	Customers       int64 `json:"customers"`
	Requests        int64 `json:"requests"`
	WindowsCompared int64 `json:"windows_compared"`
	// Suspect counts the differences not yet stable; Findings the open
	// findings this run saw (New: opened by it); Resolved those it resolved.
	Suspect  int            `json:"suspect"`
	Findings []UsageFinding `json:"findings"`
	Resolved []UsageFinding `json:"resolved,omitempty"`
	// OpenFindings counts every open usage finding when the run ends
	// (Findings lists the first 1,000); OpenByKind and DriftUnits split
	// them by kind, DriftUnits as the sum of |Stripe − ledger|.
	OpenFindings int                 `json:"open_findings"`
	OpenByKind   map[UsageKind]int   `json:"open_by_kind,omitempty"`
	DriftUnits   map[UsageKind]int64 `json:"drift_units,omitempty"`
	// Corrections made (or finished) by this run, and the ones skipped.
	Corrections []UsageCorrection `json:"corrections,omitempty"`
	Duration    time.Duration     `json:"duration_ns"`

	opened map[int64]bool // findings that became open in this run
	// held: per meter and customer, the windows this run did not compare
	// (their delivery has not settled): their findings are not acted on.
	held map[string][][2]time.Time
}

// isHeld reports whether f's window overlaps one the run did not compare.
func (r *UsageReport) isHeld(f UsageFinding) bool {
	for _, h := range r.held[f.EventName+"\x00"+f.StripeCustomerID] {
		if h[0].Before(f.WindowEnd) && h[1].After(f.WindowStart) {
			return true
		}
	}
	return false
}

// ErrUsageSpan: the run has no settled window to compare.
var ErrUsageSpan = errors.New("no settled usage window to compare")

// usageSpan is the run's windows: whole days [dailyFrom, hourlyFrom), hours
// [hourlyFrom, to).
type usageSpan struct{ dailyFrom, hourlyFrom, to time.Time }

func (u UsageConfig) span(now time.Time) (usageSpan, error) {
	now = now.UTC()
	day := func(t time.Time) time.Time { return t.Truncate(24 * time.Hour) } // UTC midnight: Unix time has no leap seconds
	s := usageSpan{to: now.Add(-u.SettleDelay).Truncate(time.Hour)}
	s.hourlyFrom = minTime(day(now.Add(-u.HourlyFor)), day(s.to))
	s.dailyFrom = minTime(day(now.Add(-u.Lookback)).Add(24*time.Hour), s.hourlyFrom)
	if !s.dailyFrom.Before(s.to) {
		return s, ErrUsageSpan
	}
	return s, nil
}

// ReconcileUsage compares Stripe's meter summaries with the ledger's
// delivered totals (see the file's doc), stores and resolves usage
// findings, alerts with the new ones and, with Usage.AutoCorrect, corrects
// what Stripe allows. Runs are serialised by a lease of their own (lock.go)
// (ErrLocked past LockWait).
func (a *Auditor) ReconcileUsage(ctx context.Context) (UsageReport, error) {
	start := time.Now()
	lock, err := a.lock(ctx, lockUsage, a.cfg.LockWait)
	if err != nil {
		return UsageReport{}, err
	}
	defer lock.release()
	ctx = lock.ctx // ends when the lease is lost: the run writes nothing more
	u := a.cfg.Usage
	now := a.cfg.Clock.Now().UTC()
	sp, err := u.span(now)
	if err != nil {
		return UsageReport{}, err
	}
	rep := UsageReport{DailyFrom: sp.dailyFrom, HourlyFrom: sp.hourlyFrom, To: sp.to, Skipped: map[string]string{}, opened: map[int64]bool{}}
	if rep.RunID, err = a.store.startUsageRun(ctx, sp, now); err != nil {
		return rep, err
	}
	runErr := a.reconcileUsage(ctx, sp, &rep)
	if lost := lock.lost(); lost != nil {
		runErr = errors.Join(runErr, lost)
	}
	rep.Duration = time.Since(start)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := a.store.finishUsageRun(fctx, rep, runErr, a.cfg.Clock.Now()); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if runErr != nil {
		a.log.Error("usage reconciliation failed", slog.Int64("usage_run_id", rep.RunID), slog.Any("error", runErr))
		return rep, fmt.Errorf("usage run %d: %w", rep.RunID, runErr)
	}
	a.log.Info("usage reconciliation finished", slog.Int64("usage_run_id", rep.RunID), slog.Int("meters", len(rep.Meters)),
		slog.Int64("customers", rep.Customers), slog.Int64("requests", rep.Requests), slog.Int64("windows", rep.WindowsCompared),
		slog.Int("suspect", rep.Suspect), slog.Int("open_findings", rep.OpenFindings), slog.Int("resolved", len(rep.Resolved)),
		slog.Int("corrections", len(rep.Corrections)), slog.Duration("duration", rep.Duration))
	a.alertUsage(rep)
	return rep, nil
}

func (a *Auditor) reconcileUsage(ctx context.Context, sp usageSpan, rep *UsageReport) error {
	if err := a.store.clearUsageStage(ctx, 0); err != nil { // a crashed run's scratch: we hold the lock
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := a.store.clearUsageStage(cctx, rep.RunID); err != nil {
			a.log.Warn("usage stage left behind; the next run clears it", slog.Any("error", err))
		}
	}()
	a.log.Debug("usage run started", slog.Int64("usage_run_id", rep.RunID), slog.Time("daily_from", sp.dailyFrom),
		slog.Time("hourly_from", sp.hourlyFrom), slog.Time("to", sp.to))
	staged, err := a.meters.StageWindowTotals(ctx, rep.RunID, sp.dailyFrom, sp.hourlyFrom, sp.to)
	if err != nil {
		return err
	}
	a.log.Debug("usage windows staged", slog.Int64("windows", staged))
	if err := a.store.analyzeUsageStage(ctx); err != nil {
		return err
	}
	names, err := a.store.stagedMeters(ctx, rep.RunID)
	if err != nil {
		return err
	}
	meters := map[string]stripeapi.Meter{}
	if len(names) > 0 {
		list, err := a.stripe.ListMeters(ctx)
		if err != nil {
			return fmt.Errorf("listing Stripe's meters: %w", err)
		}
		a.log.Debug("usage meters listed", slog.Int("meters", len(list)))
		for _, m := range list {
			if m.Status == "" || m.Status == "active" {
				meters[m.EventName] = m
			}
		}
	}
	for _, name := range names {
		m, ok := meters[name]
		measure := ""
		switch {
		case !ok:
			rep.Skipped[name] = "no active meter at Stripe has this event name"
		case m.Formula == stripeapi.MeterFormulaSum:
			measure = "sum"
		case m.Formula == stripeapi.MeterFormulaCount:
			measure = "count" // the meter counts events: the ledger's delivered events are compared
		default:
			rep.Skipped[name] = fmt.Sprintf("meter %s keeps the %s value of its events: a total is not defined, so it is not compared", m.ID, m.Formula)
		}
		if measure == "" {
			a.log.Warn("usage meter not compared", slog.String("event_name", name), slog.String("why", rep.Skipped[name]))
			continue
		}
		rep.Meters = append(rep.Meters, name)
		if err := a.reconcileMeter(ctx, sp, m, measure, rep); err != nil {
			return err
		}
	}
	if err := a.store.forgetCompared(ctx, a.cfg.Clock.Now()); err != nil {
		return err
	}
	if a.cfg.Usage.AutoCorrect {
		if err := a.correctUsage(ctx, rep); err != nil {
			return err
		}
	} else if err := a.nameManualCorrections(ctx, rep); err != nil {
		return err
	}
	if rep.Findings, err = a.store.UsageFindings(ctx, UsageFilter{State: "open"}); err != nil {
		return err
	}
	for i := range rep.Findings {
		rep.Findings[i].New = rep.opened[rep.Findings[i].ID]
	}
	if rep.OpenByKind, rep.DriftUnits, err = a.store.usageOpenTotals(ctx); err != nil {
		return err
	}
	rep.OpenFindings = rep.OpenByKind[UsageOver] + rep.OpenByKind[UsageUnder]
	return nil
}

// stagedWindow is one window of the stage: the ledger's side.
type stagedWindow struct {
	start, end time.Time
	value      int64 // delivered
	events     int64
	// The events of unknown outcome: their negative and positive values,
	// their number; the corrections not confirmed: their negative and
	// positive units.
	unknownLow, unknownHigh, unknownEvents int64
	correctionLow, correctionHigh          int64
	// lastDelivery: the latest delivery (or first attempt) of the window's
	// events; lastCorrection: the latest correction sent or recorded (zero:
	// none).
	lastDelivery, lastCorrection time.Time
}

// interval is what Stripe may show for w without a difference: the
// delivered total widened by what the events of unknown outcome and the
// unconfirmed corrections may add (a count meter: one per unknown event).
func (w stagedWindow) interval(measure string) (led, lo, hi int64) {
	if measure == "count" {
		return w.events, w.events + w.correctionLow, w.events + w.unknownEvents + w.correctionHigh
	}
	return w.value, w.value + w.unknownLow + w.correctionLow, w.value + w.unknownHigh + w.correctionHigh
}

// settlesAt is when w's summary at Stripe is expected to be whole: its
// last delivery and its last correction older than the settle delay.
// Stripe's summaries lag what it received, and a backlog or a re-drive
// delivers events hours after their timestamps.
func (w stagedWindow) settlesAt(delay time.Duration) time.Time {
	return maxTime(w.lastDelivery, w.lastCorrection).Add(delay)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// unknown reports whether w holds anything of unknown outcome.
func (w stagedWindow) unknown() bool {
	return w.unknownEvents > 0 || w.correctionLow != 0 || w.correctionHigh != 0
}

// customerResult is one (meter, customer) compared.
type customerResult struct {
	customer string
	// ranges compared, each [from, to)
	ranges [][2]time.Time
	// held: windows of the ranges not compared (their delivery has not
	// settled): their findings stay as they are.
	held     [][2]time.Time
	diffs    []windowDiff
	windows  int64
	requests int64
}

type windowDiff struct {
	start, end     time.Time
	ledger, stripe int64
	// low and high bound the interval Stripe's value was compared with;
	// unknownNote names what makes it wide.
	low, high   int64
	unknownNote string
	// early says why the window was compared before its delivery settled
	// (its invoice closes first): a person looks, nothing is corrected.
	early string
}

// reconcileMeter compares one meter, a page of customers at a time, the
// customers of a page side by side (Config.Parallel), and stores each
// page's observations in two statements.
func (a *Auditor) reconcileMeter(ctx context.Context, sp usageSpan, m stripeapi.Meter, measure string, rep *UsageReport) error {
	after := ""
	for {
		page, err := a.store.usageStagePage(ctx, rep.RunID, m.EventName, after, a.cfg.Usage.CustomerPage)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		a.log.Debug("usage customers read", slog.Int("customers", len(page)))
		customers := make([]string, 0, len(page))
		for c := range page {
			customers = append(customers, c)
		}
		slices.Sort(customers)
		after = customers[len(customers)-1]
		results := make([]customerResult, len(customers))
		errs := make([]error, len(customers))
		var wg sync.WaitGroup
		sem := make(chan struct{}, a.cfg.Parallel)
		for i, c := range customers {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				t0 := time.Now()
				results[i], errs[i] = a.compareCustomer(ctx, sp, m, measure, c, page[c])
				a.log.Debug("usage customer compared", slog.String("customer", c), slog.Duration("took", time.Since(t0)))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for _, r := range results {
			if len(r.held) > 0 {
				if rep.held == nil {
					rep.held = map[string][][2]time.Time{}
				}
				rep.held[m.EventName+"\x00"+r.customer] = r.held
			}
			rep.Customers++
			rep.Requests += r.requests
			rep.WindowsCompared += r.windows
		}
		obs, err := a.store.observeUsage(ctx, rep.RunID, m, measure, results, a.cfg.Usage.StableChecks, a.cfg.Clock.Now())
		if err != nil {
			return err
		}
		if err := a.store.recordCompared(ctx, rep.RunID, m.EventName, sp, results, a.cfg.Clock.Now()); err != nil {
			return err
		}
		rep.Suspect += obs.suspect
		rep.Resolved = append(rep.Resolved, obs.resolved...)
		for _, id := range obs.opened {
			rep.opened[id] = true
		}
	}
}

// compareCustomer reads Stripe's summaries of one customer for the ranges
// the ledger delivered in (one request each: the days, the hours) and
// compares every window with usage on either side.
func (a *Auditor) compareCustomer(ctx context.Context, sp usageSpan, m stripeapi.Meter, measure, customer string, ws []stagedWindow) (customerResult, error) {
	r := customerResult{customer: customer}
	now := a.cfg.Clock.Now().UTC()
	type rng struct {
		from, to time.Time
		window   stripeapi.MeterWindow
	}
	var rs []rng
	for _, w := range ws {
		if w.start.Before(sp.hourlyFrom) {
			if len(rs) == 0 {
				rs = append(rs, rng{sp.dailyFrom, sp.hourlyFrom, stripeapi.MeterWindowDay})
			}
		} else if len(rs) == 0 || rs[len(rs)-1].window != stripeapi.MeterWindowHour {
			rs = append(rs, rng{sp.hourlyFrom, sp.to, stripeapi.MeterWindowHour})
		}
	}
	for _, x := range rs {
		sums, err := a.stripe.MeterEventSummaries(ctx, m.ID, customer, x.from, x.to, x.window)
		r.requests++
		if err != nil {
			return r, fmt.Errorf("usage of %s on meter %s: %w", customer, m.EventName, err)
		}
		r.ranges = append(r.ranges, [2]time.Time{x.from, x.to})
		stripeBy := make(map[time.Time]int64, len(sums))
		for _, s := range sums {
			stripeBy[s.Start.UTC()] = roundUnits(s.Value)
		}
		seen := map[time.Time]bool{}
		for _, w := range ws {
			if w.start.Before(x.from) || !w.start.Before(x.to) {
				continue
			}
			seen[w.start] = true
			early := ""
			if settles := w.settlesAt(a.cfg.Usage.SettleDelay); now.Before(settles) {
				closes := a.cfg.Usage.InvoiceClosesAt(customer, w.start)
				if closes.After(settles) {
					// Stripe's summary may lag the delivery, not the
					// window: wait until the delivery settled.
					r.held = append(r.held, [2]time.Time{w.start, w.end})
					continue
				}
				early = fmt.Sprintf("Compared before its deliveries settled (the last at %s; settled at %s): the invoice closes at %s. "+
					"Stripe's summary may still be behind: check the meter's events at Stripe before acting; nothing is corrected automatically "+
					"until the window settles.", maxTime(w.lastDelivery, w.lastCorrection).Format(time.RFC3339), settles.Format(time.RFC3339),
					closes.Format(time.RFC3339))
			}
			led, lo, hi := w.interval(measure)
			r.windows++
			if st := stripeBy[w.start]; st < lo || st > hi {
				d := windowDiff{start: w.start, end: w.end, ledger: led, stripe: st, low: lo, high: hi, early: early}
				if w.unknown() {
					note, err := a.unknownNote(ctx, m.EventName, customer, w)
					if err != nil {
						return r, err
					}
					d.unknownNote = note
				}
				r.diffs = append(r.diffs, d)
			}
		}
		for _, s := range sums {
			start := s.Start.UTC()
			if seen[start] || stripeBy[start] == 0 {
				continue
			}
			r.windows++
			r.diffs = append(r.diffs, windowDiff{start: start, end: s.End.UTC(), stripe: stripeBy[start]})
		}
	}
	return r, nil
}

// roundUnits turns Stripe's float aggregate into whole units (pelguard
// sends integers; a float64 holds them exactly up to 2^53).
func roundUnits(v float64) int64 {
	if v < 0 {
		return -int64(-v + 0.5)
	}
	return int64(v + 0.5)
}
