package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/tracing"
	"github.com/pelguard/pelguard/stripeapi"
)

// Auditor runs audits and refunds. It is safe for concurrent use; the
// lease rows of lock.go, not the Auditor, keep runs from overlapping, so two
// processes are as safe as two goroutines.
type Auditor struct {
	cfg      Config
	store    *Store
	ledger   *ledger.Ledger
	meters   *meterledger.Ledger
	stripe   *stripeapi.Client
	legacyRE *regexp.Regexp
	log      *slog.Logger
	tracer   trace.Tracer
	pages    atomic.Int64

	// afterLock, when set, runs once a run holds the lock: tests use it to
	// hold a run in progress instead of sleeping.
	afterLock func()
}

// New validates cfg, applies the defaults and builds the Stripe adapter.
func New(cfg Config) (*Auditor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("audit config: %w", err)
	}
	cfg = cfg.withDefaults()
	a := &Auditor{cfg: cfg, store: NewStore(cfg.DB, cfg.Schema), log: cfg.Logger, tracer: tracing.Tracer(cfg.TracerProvider)}
	a.ledger = ledger.New(cfg.DB, cfg.Schema, cfg.Clock)
	var err error
	if a.meters, err = meterledger.New(cfg.DB, meterledger.Config{Schema: cfg.Schema, Clock: cfg.Clock, SafeWindow: cfg.Usage.SafeWindow}); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	sc := cfg.Stripe
	sc.HTTPClient = countingClient(sc.HTTPClient, &a.pages)
	if a.stripe, err = stripeapi.New(sc); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if cfg.Legacy {
		a.legacyRE = regexp.MustCompile(cfg.LegacyPattern) // checked by Validate
	}
	return a, nil
}

// Store gives access to the findings.
func (a *Auditor) Store() *Store { return a.store }

// Report is what one run found.
type Report struct {
	RunID  int64     `json:"run_id"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Period string    `json:"period,omitempty"`
	Manual bool      `json:"manual"`
	Legacy bool      `json:"legacy"`

	ChargesScanned int64 `json:"charges_scanned"`
	Pages          int64 `json:"pages"`
	// PelguardCharges counts the marked charges and the unmarked ones a
	// ledger row records; LegacyCharges the other unmarked ones --legacy
	// kept (a billing period found).
	PelguardCharges int64 `json:"pelguard_charges"`
	LegacyCharges   int64 `json:"legacy_charges"`
	LedgerCharged   int64 `json:"ledger_charged_rows"`
	// PendingRechecked counts the remembered pending charges (money in
	// motion) this run read again at Stripe; PendingCharges those still
	// pending after it, which later runs keep reading (see pending.go).
	PendingRechecked int   `json:"pending_rechecked"`
	PendingCharges   int64 `json:"pending_charges"`

	// Findings is everything this run detected, new or already known, in
	// kind order; New marks the ones this run added.
	Findings []Finding `json:"findings"`
	// NewFindings counts the findings this run added. OpenFindings counts
	// the findings still open when the run ends (of Period, when set),
	// detected by this run or not: one stored by `consumer import` or by
	// an earlier window stays open until refunded, resolved or dismissed,
	// whatever this window saw. After --auto-refund it is counted again.
	NewFindings  int `json:"new_findings"`
	OpenFindings int `json:"open_findings"`
	// Resolved lists the open findings this run resolved by itself, each
	// with its Resolution (see review.go).
	Resolved []Finding `json:"resolved,omitempty"`

	Duration time.Duration `json:"duration_ns"`
	// Refund is set when AutoRefund ran after the audit.
	Refund *RefundReport `json:"refund,omitempty"`
}

// ExitCode is the auditor's documented status: 0 clean, 1 open findings
// remain (OpenFindings). (2, an error, is the caller's.)
func (r Report) ExitCode() int {
	if r.OpenFindings > 0 {
		return 1
	}
	return 0
}

// Run audits one window: it lists Stripe, compares with the ledger, stores
// the findings, alerts with the new ones and, with AutoRefund, refunds open
// duplicates within the caps. It returns ErrLocked when another run holds
// the lock past LockWait, ErrEmptyWindow when there is nothing to audit.
// The run is one pelguard.audit_run span.
func (a *Auditor) Run(ctx context.Context, w Window) (Report, error) {
	ctx, span := a.tracer.Start(ctx, "pelguard.audit_run")
	defer span.End()
	rep, err := a.run(ctx, w)
	span.SetAttributes(attribute.Int64("pelguard.audit.run_id", rep.RunID),
		attribute.Int64("pelguard.audit.charges_scanned", rep.ChargesScanned),
		attribute.Int("pelguard.audit.new_findings", rep.NewFindings),
		attribute.Int("pelguard.audit.open_findings", rep.OpenFindings))
	if err != nil {
		span.SetStatus(codes.Error, "audit run failed") // not err's text: it may quote a request
	}
	return rep, err
}

func (a *Auditor) run(ctx context.Context, w Window) (Report, error) {
	start := time.Now()
	lock, err := a.lock(ctx, lockRun, a.cfg.LockWait)
	if err != nil {
		return Report{}, err
	}
	defer lock.release()
	ctx = lock.ctx // ends when the lease is lost: the run writes nothing more
	if a.afterLock != nil {
		a.afterLock()
	}
	// The window is resolved under the lock, so a run that waited for
	// another starts from the checkpoint that one just wrote.
	manual := w.Manual()
	w, err = a.resolve(ctx, w)
	if err != nil {
		return Report{}, err
	}
	rep := Report{From: w.From, To: w.To, Period: w.Period, Manual: manual, Legacy: a.cfg.Legacy}
	if rep.RunID, err = a.store.startRun(ctx, w, manual, a.cfg.Clock.Now()); err != nil {
		return rep, err
	}
	a.log.Info("audit run started", slog.Int64("run_id", rep.RunID), slog.Time("from", w.From),
		slog.Time("to", w.To), slog.String("period", w.Period), slog.Bool("legacy", a.cfg.Legacy))

	runErr := a.audit(ctx, w, &rep)
	if lost := lock.lost(); lost != nil {
		runErr = errors.Join(runErr, lost)
	}
	rep.Duration = time.Since(start)
	// Record the outcome even when the caller's context ended: a run left
	// "running" would look stuck to an operator.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := a.store.finishRun(fctx, rep.RunID, rep.ChargesScanned, rep.NewFindings, len(rep.Resolved), runErr, a.cfg.Clock.Now()); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if runErr != nil {
		a.alertKey(runErr)
		a.log.Error("audit run failed", slog.Int64("run_id", rep.RunID), slog.Any("error", runErr))
		return rep, fmt.Errorf("audit run %d: %w", rep.RunID, runErr)
	}
	a.log.Info("audit run finished", slog.Int64("run_id", rep.RunID), slog.Int64("charges_scanned", rep.ChargesScanned),
		slog.Int64("pages", rep.Pages), slog.Int("findings", len(rep.Findings)), slog.Int("new_findings", rep.NewFindings),
		slog.Int("open_findings", rep.OpenFindings), slog.Int("resolved_findings", len(rep.Resolved)), slog.Duration("duration", rep.Duration))
	a.alert(ctx, rep)

	if a.cfg.AutoRefund {
		rr, err := a.refund(ctx, RefundOptions{MaxRefunds: a.cfg.MaxRefunds, MaxCents: a.cfg.MaxCents, Source: SourceAutoRefund})
		rep.Refund = &rr
		if err != nil {
			a.alertKey(err)
			return rep, fmt.Errorf("auto-refund after run %d: %w", rep.RunID, err)
		}
		if rep.OpenFindings, err = a.store.countOpen(ctx, w.Period); err != nil {
			return rep, fmt.Errorf("after the auto-refund of run %d: %w", rep.RunID, err)
		}
	}
	return rep, nil
}

// resolve turns the requested window into concrete bounds.
func (a *Auditor) resolve(ctx context.Context, w Window) (Window, error) {
	now := a.cfg.Clock.Now()
	upper := now.Add(-a.cfg.SettleDelay)
	if w.Period != "" && w.From.IsZero() && w.To.IsZero() {
		start, err := time.Parse("2006-01", w.Period)
		if err != nil {
			return w, fmt.Errorf("period %q is not YYYY-MM; give --from and --to for other periods: %w", w.Period, ErrEmptyWindow)
		}
		w.From, w.To = start, start.AddDate(0, 1, 0).Add(a.cfg.PeriodGrace)
		if w.To.After(upper) {
			w.To = upper
		}
	}
	if w.To.IsZero() {
		w.To = upper
	}
	if w.From.IsZero() {
		cp, ok, err := a.store.checkpoint(ctx)
		if err != nil {
			return w, err
		}
		if ok {
			w.From = cp.Add(-a.cfg.Overlap)
		} else {
			w.From = w.To.Add(-a.cfg.InitialLookback)
		}
	}
	w.From, w.To = w.From.UTC(), w.To.UTC()
	if !w.From.Before(w.To) {
		return w, fmt.Errorf("[%s, %s): %w", w.From.Format(time.RFC3339), w.To.Format(time.RFC3339), ErrEmptyWindow)
	}
	return w, nil
}

// audit does the work of one run and fills rep. The listing goes to the
// run's stage (stage.go), which is emptied when the run ends, whatever
// its outcome.
func (a *Auditor) audit(ctx context.Context, w Window, rep *Report) error {
	// Under the run lock, staged rows of another run are a crashed run's.
	if err := a.store.clearStage(ctx, rep.RunID, true); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := a.store.clearStage(cctx, rep.RunID, false); err != nil {
			a.log.Warn("audit stage left behind; the next run clears it", slog.Int64("run_id", rep.RunID), slog.Any("error", err))
		}
	}()
	// The ledger rows charged in the window must each have their charge at
	// Stripe: the stage, once filled, says which have not (missingRows).
	var err error
	if rep.LedgerCharged, err = a.store.countCharged(ctx, w.From, w.To, w.Period); err != nil {
		return err
	}
	rv, err := a.newReviewer(ctx, w)
	if err != nil {
		return err
	}

	// A charge is created before the ledger records it, so the listing
	// starts ChargeLag earlier than the ledger's window.
	listFrom := w.From.Add(-a.cfg.ChargeLag)
	c := newCollector(rep.RunID, w.Period, a.legacyRE)
	c.review = rv
	pagesBefore := a.pages.Load()
	stop := a.startProgress(c, &a.pages, pagesBefore)
	phase := a.phases(rep.RunID)
	err = a.list(ctx, listFrom, w.To, c)
	stop()
	phase("listing")
	rep.ChargesScanned, rep.PelguardCharges, rep.LegacyCharges = c.scanned.Load(), c.pelguardN.Load(), c.legacyN.Load()
	if err != nil {
		return fmt.Errorf("listing Stripe charges: %w", err)
	}
	// A --period run files another period's charges as merely seen: it
	// must neither judge nor forget the charges in motion it follows.
	var n int
	if w.Period == "" {
		if n, err = a.recheckPending(ctx, c); err != nil {
			return err
		}
	}
	// Read again, not listed: they are not the window's scan.
	c.scanned.Add(-int64(n))
	rep.PendingRechecked = n
	phase("pending charges")
	if err := a.store.analyzeStage(ctx); err != nil {
		return err
	}
	missing, err := a.store.missingRows(ctx, rep.RunID, w.From, w.To, w.Period)
	if err != nil {
		return err
	}
	// Rows recorded long after their charge (a takeover that found the
	// charge at Stripe) need a look further back before they are missing.
	earliest := listFrom
	for _, r := range missing {
		if r.FirstAttemptAt.Before(earliest) {
			earliest = r.FirstAttemptAt
		}
	}
	if len(missing) > 0 && earliest.Before(listFrom) {
		if err := a.verifyMissing(ctx, rep.RunID, earliest.Truncate(time.Second), listFrom); err != nil {
			return err
		}
		if missing, err = a.store.missingRows(ctx, rep.RunID, w.From, w.To, w.Period); err != nil {
			return err
		}
	}
	rep.Pages = a.pages.Load() - pagesBefore
	phase("missing charges")
	stillMissing := make(map[string]bool, len(missing))
	var fs []Finding
	for _, r := range missing {
		stillMissing[r.ChargeID] = true
		fs = append(fs, Finding{Kind: KindMissing, Subject: r.IdempotencyKey, CustomerID: r.CustomerID,
			BillingPeriod: r.BillingPeriod, StripeCustomerID: r.StripeCustomerID, ChargeID: r.ChargeID,
			IdempotencyKey: r.IdempotencyKey, AmountCents: r.AmountCents, Currency: r.Currency,
			Detail: fmt.Sprintf("ledger recorded charge %s at %s; Stripe has no such succeeded charge",
				r.ChargeID, r.ChargedAt.UTC().Format(time.RFC3339))})
	}
	cfs, err := a.chargeFindings(ctx, c)
	if err != nil {
		return err
	}
	phase("grouping")
	fs = append(fs, cfs...)
	ufs, err := a.unsettledFindings(ctx, rep.RunID, w.Period)
	if err != nil {
		return err
	}
	fs = append(fs, ufs...)
	sfs, err := a.stuckFindings(ctx, w.Period, ufs)
	if err != nil {
		return err
	}
	fs = append(fs, sfs...)

	slices.SortFunc(fs, func(x, y Finding) int {
		if d := slices.Index(Kinds, x.Kind) - slices.Index(Kinds, y.Kind); d != 0 {
			return d
		}
		return cmpStrings(x.Subject, y.Subject)
	})
	// One finding per (kind, subject), as the table keeps them.
	fs = slices.CompactFunc(fs, func(x, y Finding) bool { return x.Kind == y.Kind && x.Subject == y.Subject })
	if err := a.store.insertFindings(ctx, rep.RunID, fs); err != nil {
		return err
	}
	phase("storing findings")
	if rep.Resolved, err = a.resolveFindings(ctx, rep.RunID, rv, fs, stillMissing); err != nil {
		return err
	}
	// Only now, with the findings stored: a run that fails keeps
	// following what it would have forgotten.
	if rep.PendingCharges, err = a.store.rememberPending(ctx, rep.RunID, w.Period == "", a.cfg.Clock.Now()); err != nil {
		return err
	}
	for _, f := range rep.Resolved {
		a.log.Info("finding resolved by the run", slog.Int64("finding_id", f.ID), slog.String("kind", string(f.Kind)),
			slog.String("subject", f.Subject), slog.String("resolution", f.Resolution))
	}
	rep.Findings = fs
	for _, f := range fs {
		if f.New {
			rep.NewFindings++
		}
	}
	// The table, not this run's findings: an open finding the window did
	// not see again (an import's duplicate outside it, one of a charge
	// made within the settle delay) still needs a person (issue 25).
	rep.OpenFindings, err = a.store.countOpen(ctx, w.Period)
	return err
}

// phases returns a function that logs, at debug level, how long the run's
// phase just ended took: where a large window's time goes.
func (a *Auditor) phases(runID int64) func(name string) {
	last := time.Now()
	return func(name string) {
		now := time.Now()
		a.log.Debug("audit phase done", slog.Int64("run_id", runID), slog.String("phase", name), slog.Duration("took", now.Sub(last)))
		last = now
	}
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// stuckFindings reports the pending rows nobody works on (StuckAfter) and
// the processing rows whose debit has been in motion longer than any bank
// takes to settle one (StuckProcessingAfter), except the rows unsettled
// already reports.
func (a *Auditor) stuckFindings(ctx context.Context, period string, unsettled []Finding) ([]Finding, error) {
	var fs []Finding
	now := a.cfg.Clock.Now()
	reported := map[string]bool{}
	for _, f := range unsettled {
		reported[f.Subject] = true
	}
	err := a.ledger.ScanStuckProcessing(ctx, now.Add(-a.cfg.StuckProcessingAfter), func(r ledger.Record) error {
		if (period != "" && r.BillingPeriod != period) || reported[r.IdempotencyKey] {
			return nil
		}
		fs = append(fs, Finding{Kind: KindStuckPending, Subject: r.IdempotencyKey, CustomerID: r.CustomerID,
			BillingPeriod: r.BillingPeriod, StripeCustomerID: r.StripeCustomerID, ChargeID: r.ChargeID,
			IdempotencyKey: r.IdempotencyKey, AmountCents: r.AmountCents, Currency: r.Currency,
			Detail: fmt.Sprintf("processing since %s: its debit %s has waited longer than --stuck-processing-after (%s) for a settlement "+
				"no bank takes that long to give; the consumer's follow-up loop (polls, webhooks) is off or failing: check the charge at Stripe",
				r.UpdatedAt.UTC().Format(time.RFC3339), r.ChargeID, a.cfg.StuckProcessingAfter)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading stuck processing rows: %w", err)
	}
	err = a.ledger.ScanStuckPending(ctx, now.Add(-a.cfg.StuckAfter), func(r ledger.Record) error {
		if period != "" && r.BillingPeriod != period {
			return nil
		}
		detail := fmt.Sprintf("pending since %s (%d attempts, last error %q); nobody holds its lease",
			r.FirstAttemptAt.UTC().Format(time.RFC3339), r.Attempts, r.LastError)
		if r.Parked() {
			detail = fmt.Sprintf("parked at %s: the ledger stopped retrying attempt %d by itself (%s); nothing was charged or "+
				"recorded by guess: check the customer at Stripe, then `"+cmdname.Consumer+" retry --period %s --customer %s`",
				r.ParkedAt.UTC().Format(time.RFC3339), r.Attempt, r.ParkedReason, r.BillingPeriod, r.CustomerID)
		}
		fs = append(fs, Finding{Kind: KindStuckPending, Subject: r.IdempotencyKey, CustomerID: r.CustomerID,
			BillingPeriod: r.BillingPeriod, StripeCustomerID: r.StripeCustomerID, IdempotencyKey: r.IdempotencyKey,
			AmountCents: r.AmountCents, Currency: r.Currency, Detail: detail})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading stuck pending rows: %w", err)
	}
	return fs, nil
}
