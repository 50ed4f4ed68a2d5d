package audit

import (
	"context"
	"fmt"

	"github.com/pelguard/pelguard/internal/ledger"
)

// Findings re-evaluated on every run (issue 17): a finding recorded while
// the ledger write was late, or before a refund made elsewhere, must not
// stay open and keep offering a remedy for a problem that is gone (an open
// orphan is the canonical charge once the ledger records it). Each run
// re-checks the open findings it can see and resolves, with the run and
// the reason, those whose cause it can prove gone. It never resolves on
// mere absence: a charge outside the window, or a duplicate whose
// canonical fell outside it, is not seen, and that proves nothing.

// resolution is one finding a run resolved, and why.
type resolution struct {
	id     int64
	reason string
}

// fact is what the listing showed of a watched charge (one named by an
// open finding, as its charge or its canonical).
type fact struct {
	status   string
	net      int64
	disputed bool
	intent   string
}

// findingKey identifies a finding: the table's UNIQUE (kind, subject).
type findingKey struct {
	kind    Kind
	subject string
}

// review is what a run knows when it re-checks the open findings: pure
// data, so decide is table-tested without Stripe or Postgres.
type review struct {
	// legacy and period are the run's mode: a run without --legacy cannot
	// judge a legacy finding, a run of one period another period's.
	legacy bool
	period string
	// detected holds every finding this run found again.
	detected map[findingKey]bool
	// seen holds the watched charges the listing showed, by charge id.
	seen map[string]fact
	// recorded holds the ledger rows that record a watched charge, by the
	// watched charge id.
	recorded map[string]ledger.Record
	// rows holds the ledger rows of the open findings' keys (orphans and
	// stuck rows), when they exist.
	rows map[ledger.Key]ledger.Record
	// missingSeen holds the charge ids of open missing_charge findings that
	// this run listed as succeeded.
	missingSeen map[string]bool
}

// decide returns why f is resolved, or "" when it stays open.
func (r review) decide(f Finding) string {
	if r.detected[findingKey{f.Kind, f.Subject}] {
		return ""
	}
	if (f.Legacy && !r.legacy) || (r.period != "" && f.BillingPeriod != r.period) {
		return ""
	}
	ch, seen := r.seen[f.ChargeID]
	rec, recorded := r.recorded[f.ChargeID]
	recorded = recorded && rec.Status == ledger.StatusCharged
	key := ledger.Key{CustomerID: f.CustomerID, BillingPeriod: f.BillingPeriod}
	switch f.Kind {
	case KindOrphan:
		switch {
		case recorded:
			return fmt.Sprintf("the ledger now records this charge for %s/%s (a late ledger write)", rec.CustomerID, rec.BillingPeriod)
		case seen && ch.net <= 0:
			return "fully refunded at Stripe since the finding"
		}
		if row, ok := r.rows[key]; ok && seen && row.Status == ledger.StatusCharged &&
			r.detected[findingKey{KindDuplicate, f.ChargeID}] {
			return fmt.Sprintf("the ledger now records charge %s for this customer and period; this charge is now a duplicate_charge finding", row.ChargeID)
		}
	case KindMissing:
		if r.missingSeen[f.ChargeID] {
			return fmt.Sprintf("Stripe now lists charge %s as succeeded", f.ChargeID)
		}
	case KindDuplicate, KindAmbiguousLegacy:
		canon, canonSeen := r.seen[f.CanonicalChargeID]
		switch {
		case recorded:
			return fmt.Sprintf("the ledger records this charge for %s/%s: it is the canonical charge", rec.CustomerID, rec.BillingPeriod)
		case seen && ch.net <= 0:
			return "fully refunded at Stripe outside pelguard"
		case seen && f.Kind == KindDuplicate && canonSeen && canon.net <= 0:
			return fmt.Sprintf("its canonical charge %s was refunded at Stripe; this charge now holds the period's money", f.CanonicalChargeID)
		case f.Kind == KindDuplicate && r.detected[findingKey{KindAmbiguousLegacy, f.Subject}]:
			return "the charge is now an ambiguous_legacy finding: nothing proves it is this customer's second charge"
		}
	case KindAmountMismatch:
		if seen {
			return "the charge no longer differs from the ledger's row"
		}
	case KindDisputed:
		if seen && !ch.disputed {
			return "Stripe no longer reports the charge as disputed"
		}
	case KindStuckPending:
		// Stuck rows are scanned over the whole ledger, not a window: one
		// not found again has moved on or is gone. A row someone works on
		// again is left open; it may stall again.
		row, ok := r.rows[key]
		switch {
		case !ok:
			return "the ledger row is gone"
		case row.IdempotencyKey != f.Subject:
			return "the ledger row now has another idempotency key"
		case row.Status.Terminal():
			return fmt.Sprintf("the ledger row is now %s", row.Status)
		}
	}
	return ""
}

// reviewer collects, before and during the listing, what decide needs.
type reviewer struct {
	open []Finding
	// watch holds the charge ids the listing must report (c.mu held).
	watch map[string]bool
	seen  map[string]fact
	// missingInWindow holds the charge ids of open missing findings whose
	// row this run's window scanned: the listing decides them.
	missingInWindow map[string]bool
}

// newReviewer loads the open findings the run of w may re-check.
func (a *Auditor) newReviewer(ctx context.Context, w Window) (*reviewer, error) {
	open, err := a.store.openFindings(ctx, w.Period)
	if err != nil {
		return nil, err
	}
	rv := &reviewer{open: open, watch: map[string]bool{}, seen: map[string]fact{}}
	var missing []string
	for _, f := range open {
		switch f.Kind {
		case KindMissing:
			missing = append(missing, f.ChargeID)
		case KindStuckPending:
		default:
			for _, id := range []string{f.ChargeID, f.CanonicalChargeID} {
				if id != "" {
					rv.watch[id] = true
				}
			}
		}
	}
	if rv.missingInWindow, err = a.store.chargedAmong(ctx, missing, w.From, w.To, w.Period); err != nil {
		return nil, err
	}
	return rv, nil
}

// note records a listed charge if an open finding names it (c.mu held).
func (rv *reviewer) note(id string, f fact) {
	if rv != nil && rv.watch[id] {
		rv.seen[id] = f
	}
}

// resolve decides the open findings against what the run found (fs) and
// saw, and records the resolutions under runID. stillMissing holds the
// charge ids of the window's charged rows the listing did not show.
func (a *Auditor) resolveFindings(ctx context.Context, runID int64, rv *reviewer, fs []Finding, stillMissing map[string]bool) ([]Finding, error) {
	if len(rv.open) == 0 {
		return nil, nil
	}
	r := review{legacy: a.cfg.Legacy, period: "", detected: map[findingKey]bool{}, seen: rv.seen,
		rows: map[ledger.Key]ledger.Record{}, missingSeen: map[string]bool{}}
	for _, f := range fs {
		r.detected[findingKey{f.Kind, f.Subject}] = true
	}
	for id := range rv.missingInWindow {
		if !stillMissing[id] {
			r.missingSeen[id] = true
		}
	}
	var ids []string
	var keys []ledger.Key
	for _, f := range rv.open {
		switch f.Kind {
		case KindOrphan, KindStuckPending:
			if f.CustomerID != "" && f.BillingPeriod != "" {
				keys = append(keys, ledger.Key{CustomerID: f.CustomerID, BillingPeriod: f.BillingPeriod})
			}
		}
		if f.Kind == KindOrphan || f.Kind == KindDuplicate || f.Kind == KindAmbiguousLegacy {
			ids = append(ids, f.ChargeID)
			if ch, ok := rv.seen[f.ChargeID]; ok && ch.intent != "" {
				ids = append(ids, ch.intent)
			}
		}
	}
	recs, err := a.byChargeIDs(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger rows of open findings' charges: %w", err)
	}
	r.recorded = map[string]ledger.Record{}
	for _, f := range rv.open {
		if rec, ok := recs[f.ChargeID]; ok {
			r.recorded[f.ChargeID] = rec
		} else if rec, ok := recs[rv.seen[f.ChargeID].intent]; ok && rv.seen[f.ChargeID].intent != "" {
			r.recorded[f.ChargeID] = rec
		}
	}
	for start := 0; start < len(keys); start += a.cfg.LookupBatch {
		got, err := a.lookup(ctx, keys[start:min(start+a.cfg.LookupBatch, len(keys))])
		if err != nil {
			return nil, fmt.Errorf("reading the ledger rows of open findings: %w", err)
		}
		for k, v := range got {
			r.rows[k] = v
		}
	}
	var rs []resolution
	var out []Finding
	for _, f := range rv.open {
		// A run of one period sees only that period's findings (the store
		// read filtered them), so the period check in decide is for
		// callers that build a review by hand.
		if why := r.decide(f); why != "" {
			rs = append(rs, resolution{f.ID, why})
			f.State, f.ResolvedByRunID, f.Resolution = StateResolved, runID, why
			out = append(out, f)
		}
	}
	if _, err := a.store.resolveByRun(ctx, runID, rs); err != nil {
		return nil, err
	}
	return out, nil
}
