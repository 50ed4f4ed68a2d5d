package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pelguard/pelguard/stripeapi"
)

// RefundKeyPrefix prefixes the idempotency key of every refund: one key per
// refunded charge, so a retried or repeated refund of the same charge is
// the same refund at Stripe (invariant 6).
const RefundKeyPrefix = "pelguard-refund-"

// RefundOptions selects what one refund run may do.
type RefundOptions struct {
	// FindingID refunds that one duplicate finding; 0 means every open
	// duplicate, oldest first.
	FindingID int64
	// MaxRefunds and MaxCents cap the run; 0 takes the Config's caps. The
	// run stops at the first refund that would pass either.
	MaxRefunds int
	MaxCents   int64
	// DryRun reports what would be refunded and changes nothing.
	DryRun bool
	// LockWait is how long to wait for another refund run; 0 fails at once
	// with ErrLocked.
	LockWait time.Duration
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
	// Skipped says why a finding was left open (never refunded).
	Skipped string `json:"skipped,omitempty"`
}

// RefundReport is what one refund run did.
type RefundReport struct {
	DryRun        bool           `json:"dry_run"`
	Refunded      []RefundResult `json:"refunded"`
	Skipped       []RefundResult `json:"skipped,omitempty"`
	RefundedCents int64          `json:"refunded_cents"`
	// StoppedBy names the cap that stopped the run ("max-refunds",
	// "max-cents"), and Remaining how many duplicates it left open.
	StoppedBy string `json:"stopped_by,omitempty"`
	Remaining int    `json:"remaining"`
}

// Refund refunds open duplicate findings with reason "duplicate", one
// idempotency key per charge, within the caps, and records each refund id.
// It never refunds a canonical charge: not the finding's, not the one the
// ledger records, and not one whose canonical charge Stripe may lack.
func (a *Auditor) Refund(ctx context.Context, opts RefundOptions) (RefundReport, error) {
	lock, err := acquireLock(ctx, a.cfg.DB, a.ledger.Schema(), lockRefund, opts.LockWait)
	if err != nil {
		return RefundReport{DryRun: opts.DryRun}, err
	}
	defer lock.release()
	return a.refundLocked(ctx, opts)
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

func (a *Auditor) refundLocked(ctx context.Context, opts RefundOptions) (RefundReport, error) {
	rep := RefundReport{DryRun: opts.DryRun}
	maxN, maxCents := opts.MaxRefunds, opts.MaxCents
	if maxN <= 0 {
		maxN = a.cfg.MaxRefunds
	}
	if maxCents <= 0 {
		maxCents = a.cfg.MaxCents
	}
	var todo []Finding
	if opts.FindingID != 0 {
		f, err := a.store.Get(ctx, opts.FindingID)
		if err != nil {
			return rep, err
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

	for i, f := range todo {
		res := RefundResult{FindingID: f.ID, ChargeID: f.ChargeID, CanonicalChargeID: f.CanonicalChargeID,
			CustomerID: f.CustomerID, StripeCustomerID: f.StripeCustomerID, BillingPeriod: f.BillingPeriod,
			AmountCents: f.AmountCents, Currency: f.Currency}
		if why, err := a.refusal(ctx, f); err != nil {
			return rep, err
		} else if why != "" {
			res.Skipped = why
			rep.Skipped = append(rep.Skipped, res)
			a.log.Warn("refund refused", slog.Int64("finding_id", f.ID), slog.String("charge_id", f.ChargeID), slog.String("reason", why))
			continue
		}
		switch {
		case len(rep.Refunded) >= maxN:
			rep.StoppedBy = "max-refunds"
		case rep.RefundedCents+f.AmountCents > maxCents:
			rep.StoppedBy = "max-cents"
		}
		if rep.StoppedBy != "" {
			rep.Remaining = len(todo) - i
			a.log.Warn("refund run stopped by its cap", slog.String("cap", rep.StoppedBy), slog.Int("remaining", rep.Remaining),
				slog.Int("max_refunds", maxN), slog.Int64("max_cents", maxCents))
			break
		}
		if !opts.DryRun {
			// Amount 0 refunds whatever the charge still holds: if someone
			// refunded part of it by hand since the audit, asking for the
			// audited amount would be refused forever.
			re, err := a.stripe.Refund(ctx, f.ChargeID, 0, RefundKeyPrefix+f.ChargeID)
			if err != nil && !errors.Is(err, stripeapi.ErrTransient) {
				// Permanent for this charge (already refunded by hand, a
				// dispute, a closed account): skip it, say why, and go on,
				// so one such finding cannot block every later refund.
				res.Skipped = "Stripe refused the refund: " + err.Error()
				rep.Skipped = append(rep.Skipped, res)
				a.log.Warn("refund refused by Stripe; skipped", slog.Int64("finding_id", f.ID), slog.String("charge_id", f.ChargeID), slog.Any("error", err))
				continue
			}
			if err != nil {
				rep.Remaining = len(todo) - i
				return rep, fmt.Errorf("refunding duplicate %s (finding %d): %w", f.ChargeID, f.ID, err)
			}
			res.RefundID = re.ID
			// Stripe has refunded; record it even if the caller gives up
			// now, or the next run would refund again (the key would then
			// replay the same refund, but only within 24 hours).
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err = a.store.markRefunded(mctx, f.ID, re.ID, re.AmountCents, a.cfg.Clock.Now())
			cancel()
			if err != nil {
				return rep, err
			}
			a.log.Info("refunded duplicate charge", slog.Int64("finding_id", f.ID), slog.String("charge_id", f.ChargeID),
				slog.String("canonical_charge_id", f.CanonicalChargeID), slog.String("refund_id", re.ID),
				slog.Int64("amount_cents", f.AmountCents), slog.String("currency", f.Currency))
		}
		rep.Refunded = append(rep.Refunded, res)
		rep.RefundedCents += f.AmountCents
	}
	return rep, nil
}

// refusal returns why f must not be refunded, or "" when it may.
func (a *Auditor) refusal(ctx context.Context, f Finding) (string, error) {
	switch {
	case f.ChargeID == "" || f.CanonicalChargeID == "":
		return "finding names no charge or no canonical charge", nil
	case f.ChargeID == f.CanonicalChargeID:
		return "the charge is the canonical charge", nil
	case f.AmountCents <= 0:
		return "nothing left to refund", nil
	}
	// Invariant 6, checked against the source of truth at the moment of the
	// refund, not only against what the audit saw: no row of the ledger may
	// record this charge, whatever customer the finding names (a legacy
	// finding may name none, and an import may have recorded the charge
	// since the audit).
	recs, err := a.ledger.ByChargeIDs(ctx, []string{f.ChargeID})
	if err != nil {
		return "", fmt.Errorf("checking the ledger before refunding %s: %w", f.ChargeID, err)
	}
	if _, ok := recs[f.ChargeID]; ok {
		return "the ledger records this charge as the canonical charge", nil
	}
	missing, err := a.store.openMissing(ctx, f.CanonicalChargeID)
	if err != nil {
		return "", err
	}
	if missing {
		return "the canonical charge has an open missing_charge finding", nil
	}
	return "", nil
}
