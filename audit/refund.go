package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/repair"
)

// RefundKeyPrefix prefixes the idempotency key of every refund: one key per
// refunded charge, so a retried or repeated refund of the same charge is
// the same refund at Stripe (invariant 6).
const RefundKeyPrefix = "pelguard-refund-"

// Who asked for a refund, as refund_ledger records it.
const (
	SourceRefundCommand = "auditor refund"
	SourceAutoRefund    = "auto-refund"
)

// RefundOptions selects what one refund run may do.
type RefundOptions struct {
	// FindingID refunds that one duplicate finding; 0 means every open
	// duplicate, oldest first.
	FindingID int64
	// MaxRefunds and MaxCents cap the run; 0 takes the Config's caps. A
	// duplicate that would pass either is skipped and the run goes on. The
	// rolling caps (Config.MaxRefunds24h, MaxCents24h) apply on top, to
	// every run together.
	MaxRefunds int
	MaxCents   int64
	// DryRun reports what would be refunded and changes nothing (it still
	// re-reads both charges at Stripe); it takes no refund lease.
	DryRun bool
	// LockWait is how long to wait for another refund run; 0 fails at once
	// with ErrLocked.
	LockWait time.Duration
	// Source names who asked (refund_ledger.source); default
	// SourceRefundCommand.
	Source string
}

// RefundResult is one refunded (or, in a dry run, refundable) duplicate.
type RefundResult struct {
	FindingID         int64  `json:"finding_id"`
	ChargeID          string `json:"charge_id"`
	CanonicalChargeID string `json:"canonical_charge_id"`
	CustomerID        string `json:"customer_id,omitempty"`
	StripeCustomerID  string `json:"stripe_customer_id,omitempty"`
	BillingPeriod     string `json:"billing_period,omitempty"`
	AmountCents       int64  `json:"amount_cents"`
	Currency          string `json:"currency"`
	RefundID          string `json:"refund_id,omitempty"`
	// SkipCode names why a finding was left open (one of the Skip*
	// constants); Skipped says it in words. Both empty when refunded.
	SkipCode SkipCode `json:"skip_code,omitempty"`
	Skipped  string   `json:"skipped,omitempty"`
}

// RollingUsage is what the rolling refund cap has used in the last 24 h
// (every refund pelguard made, whoever asked) and what it allows.
type RollingUsage struct {
	Refunds    int   `json:"refunds"`
	Cents      int64 `json:"cents"`
	MaxRefunds int   `json:"max_refunds"`
	MaxCents   int64 `json:"max_cents"`
}

// RefundReport is what one refund run did.
type RefundReport struct {
	DryRun        bool           `json:"dry_run"`
	Refunded      []RefundResult `json:"refunded"`
	Skipped       []RefundResult `json:"skipped,omitempty"`
	RefundedCents int64          `json:"refunded_cents"`
	// StoppedBy names the first cap that left a duplicate open
	// ("max-refunds", "max-cents", "max-refunds-24h", "max-cents-24h"), and
	// Remaining how many duplicates the caps left open (each is also in
	// Skipped).
	StoppedBy string `json:"stopped_by,omitempty"`
	Remaining int    `json:"remaining"`
	// Rolling is the rolling cap's use after the run.
	Rolling RollingUsage `json:"rolling_24h"`
}

// Refund refunds open duplicate findings with reason "duplicate", one
// idempotency key per charge, within the per-run and rolling caps, and
// records each refund. Right before each refund it re-reads the ledger and
// both charges at Stripe, holding the key's ledger lock until the refund is
// recorded, and refuses what is no longer a duplicate: it never refunds a
// canonical charge (invariant 6). What cannot be refunded now (refused, over
// a cap, a transient Stripe error) is skipped with its reason, recorded on
// the finding, and the run goes on with the next.
func (a *Auditor) Refund(ctx context.Context, opts RefundOptions) (RefundReport, error) {
	if opts.DryRun {
		// A dry run writes nothing, not even the refund lease's row
		// (invariant 8), and refunds nothing another run could race.
		return a.refundLocked(ctx, opts)
	}
	lock, err := a.lock(ctx, lockRefund, opts.LockWait)
	if err != nil {
		return RefundReport{DryRun: opts.DryRun}, err
	}
	defer lock.release()
	rep, err := a.refundLocked(lock.ctx, opts)
	if lost := lock.lost(); lost != nil {
		err = errors.Join(err, lost)
	}
	a.alertSkipped(rep)
	return rep, err
}

// refund is Refund for AutoRefund: a refund run already in progress
// elsewhere is not an error for a scheduled run, it will catch up next time.
func (a *Auditor) refund(ctx context.Context, opts RefundOptions) (RefundReport, error) {
	rr, err := a.Refund(ctx, opts)
	if errors.Is(err, ErrLocked) {
		a.log.Info("auto-refund skipped: another refund run is in progress")
		return rr, nil
	}
	return rr, err
}

// refundRun is one run's budget: its caps and what it has used.
type refundRun struct {
	opts     RefundOptions
	maxN     int
	maxCents int64
	n        int
	cents    int64
}

func (a *Auditor) refundLocked(ctx context.Context, opts RefundOptions) (RefundReport, error) {
	rep := RefundReport{DryRun: opts.DryRun}
	run := &refundRun{opts: opts, maxN: opts.MaxRefunds, maxCents: opts.MaxCents}
	if run.maxN <= 0 {
		run.maxN = a.cfg.MaxRefunds
	}
	if run.maxCents <= 0 {
		run.maxCents = a.cfg.MaxCents
	}
	if run.opts.Source == "" {
		run.opts.Source = SourceRefundCommand
	}
	var todo []Finding
	if opts.FindingID != 0 {
		f, err := a.store.Get(ctx, opts.FindingID)
		if err != nil {
			return rep, err
		}
		if f.Kind == KindOrphan {
			// An orphan is pelguard's charge for its key with the ledger
			// row missing: usually the customer's only charge of the
			// period, and after a ledger loss always.
			return rep, fmt.Errorf("finding %d is an orphan_charge, usually the customer's only charge for the period: never refunded; "+
				"record it (a redelivery, `"+cmdname.Consumer+" import --from-stripe`, or by hand) and resolve it: %w", f.ID, ErrState)
		}
		if f.Kind != KindDuplicate || f.State != StateOpen {
			return rep, fmt.Errorf("finding %d is an %s %s finding; only open duplicate_charge findings are refunded: %w",
				f.ID, f.State, f.Kind, ErrState)
		}
		todo = []Finding{f}
	} else {
		var err error
		if todo, err = a.store.openDuplicates(ctx); err != nil {
			return rep, err
		}
	}

	if len(todo) > 0 && !opts.DryRun {
		if err := a.catchUpRefundLedger(ctx); err != nil {
			return rep, err
		}
	}
	for _, f := range todo {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		res := RefundResult{FindingID: f.ID, ChargeID: f.ChargeID, CanonicalChargeID: f.CanonicalChargeID,
			CustomerID: f.CustomerID, StripeCustomerID: f.StripeCustomerID, BillingPeriod: f.BillingPeriod,
			AmountCents: f.AmountCents, Currency: f.Currency}
		refundID, sk, err := a.refundOne(ctx, f, run)
		if err != nil {
			return rep, err
		}
		if sk != nil {
			res.SkipCode, res.Skipped = sk.code, sk.reason
			rep.Skipped = append(rep.Skipped, res)
			if sk.code.isCap() {
				rep.Remaining++
				if rep.StoppedBy == "" {
					rep.StoppedBy = sk.code.capName()
				}
			}
			a.log.Warn("refund skipped", slog.Int64("finding_id", f.ID), slog.String("charge_id", f.ChargeID),
				slog.String("code", string(sk.code)), slog.String("reason", sk.reason))
			if !opts.DryRun {
				a.recordSkip(ctx, f.ID, *sk)
			}
			continue
		}
		res.RefundID = refundID
		rep.Refunded = append(rep.Refunded, res)
		rep.RefundedCents += f.AmountCents
		if !opts.DryRun {
			a.log.Info("refunded duplicate charge", slog.Int64("finding_id", f.ID), slog.String("charge_id", f.ChargeID),
				slog.String("canonical_charge_id", f.CanonicalChargeID), slog.String("refund_id", refundID),
				slog.Int64("amount_cents", f.AmountCents), slog.String("currency", f.Currency))
		}
	}
	used, err := a.rollingUsage(ctx, a.ledger.DB())
	if err != nil {
		return rep, err
	}
	rep.Rolling = RollingUsage{Refunds: used.n, Cents: used.cents, MaxRefunds: a.cfg.MaxRefunds24h, MaxCents: a.cfg.MaxCents24h}
	if rep.StoppedBy != "" {
		a.log.Warn("refund caps left duplicates open", slog.String("cap", rep.StoppedBy), slog.Int("remaining", rep.Remaining),
			slog.Int("max_refunds", run.maxN), slog.Int64("max_cents", run.maxCents),
			slog.Int("max_refunds_24h", a.cfg.MaxRefunds24h), slog.Int64("max_cents_24h", a.cfg.MaxCents24h))
	}
	return rep, nil
}

// alertSkipped tells Slack what a refund run left open and why.
func (a *Auditor) alertSkipped(rep RefundReport) {
	if a.cfg.Notifier == nil || rep.DryRun || len(rep.Skipped) == 0 {
		return
	}
	in := alerts.RefundSkippedInput{Refunded: len(rep.Refunded), RefundedCents: rep.RefundedCents}
	for _, s := range rep.Skipped {
		in.Skipped = append(in.Skipped, alerts.SkippedRefund{FindingID: s.FindingID, ChargeID: s.ChargeID,
			AmountCents: s.AmountCents, Currency: s.Currency, Code: string(s.SkipCode), Reason: s.Skipped})
	}
	a.cfg.Notifier.Notify(alerts.RefundSkipped(in))
}

// catchUpRefundLedger records again pelguard's refunds of the last 24 h
// that refund_ledger lacks (a failover to an asynchronous replica or a
// restore erased them), from Stripe's list of refunds, before the rolling
// cap is summed: the cap counts what Stripe refunded, whatever the ledger
// lost. One list call (a page per 100 refunds) per refund run.
func (a *Auditor) catchUpRefundLedger(ctx context.Context) error {
	now := a.cfg.Clock.Now()
	n, err := repair.RebuildRefunds(ctx, a.ledger, a.stripe, now.Add(-24*time.Hour), now.Add(time.Hour))
	if err != nil {
		return fmt.Errorf("reading the last 24 h of refunds at Stripe for the rolling cap: %w", err)
	}
	if n > 0 {
		a.log.Warn("refund_ledger lacked pelguard refunds Stripe made in the last 24 h (the ledger lost commits): recorded them again",
			slog.Int("refunds", n))
	}
	return nil
}
