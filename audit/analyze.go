package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pelguard/pelguard/internal/ledger"
)

// chargeFindings derives the duplicate, orphan and mismatch findings of
// the listed charges, read back from the run's stage one ledger key's
// group at a time, LookupBatch groups per ledger query. With --legacy, the
// legacy charges of the group's Stripe customer and period join it first,
// so an old consumer's charge and pelguard's for one customer and period
// are compared; the legacy groups left over are compared with the ledger
// rows of their Stripe customer and period.
func (a *Auditor) chargeFindings(ctx context.Context, c *collector) ([]Finding, error) {
	var fs []Finding
	err := a.store.scanStage(ctx, c.runID, stageUnkeyed, func(_ groupKey, es []entry) error {
		for _, e := range es {
			if e.disputed {
				fs = append(fs, disputedFinding(Finding{StripeCustomerID: e.stripeCustomer, IdempotencyKey: e.idemKey}, e))
			}
			fs = append(fs, Finding{Kind: KindOrphan, Subject: e.id, StripeCustomerID: e.stripeCustomer, ChargeID: e.id,
				IdempotencyKey: e.idemKey, AmountCents: e.net(), Currency: e.currency,
				Detail: "marked pelguard=1 but has no customer_id/billing_period metadata"})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	shared, stream, err := a.sharing(ctx, c)
	if err != nil {
		return nil, err
	}
	team, err := a.teamCustomers(ctx, c, stream)
	if err != nil {
		return nil, err
	}
	type group struct {
		k  groupKey
		es []entry
	}
	batch := make([]group, 0, a.cfg.LookupBatch)
	flush := func() error {
		keys := make([]ledger.Key, len(batch))
		for i, g := range batch {
			keys[i] = ledger.Key{CustomerID: g.k.customer, BillingPeriod: g.k.period}
		}
		recs, err := a.lookup(ctx, keys)
		if err != nil {
			return fmt.Errorf("reading the ledger rows of %d charged keys: %w", len(keys), err)
		}
		for i, g := range batch {
			r, ok := recs[keys[i]]
			legacy, ambiguous := matchLegacy(g.k, g.es, c.takeLegacy(g.k, g.es, shared, team), r, ok)
			fs = append(fs, ambiguous...)
			fs = append(fs, groupFindings(g.k, g.es, legacy, r, ok)...)
		}
		clear(batch)
		batch = batch[:0]
		return nil
	}
	err = a.store.scanStage(ctx, c.runID, stagePelguard, func(k groupKey, es []entry) error {
		batch = append(batch, group{k, es})
		if len(batch) == a.cfg.LookupBatch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(batch) > 0 {
		if err := flush(); err != nil {
			return nil, err
		}
	}
	lfs, err := a.legacyFindings(ctx, c.legacy, shared, team)
	if err != nil {
		return nil, err
	}
	return append(fs, lfs...), nil
}

// groupFindings decides one (customer, period) of pelguard charges, and the
// legacy charges that joined them, against its ledger row (ok=false: no
// row).
//
// The canonical charge is the ledger's charge_id when the row is charged
// (found among es by charge or intent id), else the earliest billable
// charge, legacy or not. Fully refunded charges take no part: a refund
// already undid them. A partly refunded charge still counts, for what it
// still holds. Only a pelguard charge can be an orphan: a legacy one never
// had a ledger row to miss.
func groupFindings(k groupKey, es, legacy []entry, r ledger.Record, ok bool) []Finding {
	var fs []Finding
	all := es
	if len(legacy) > 0 {
		all = slices.Concat(es, legacy)
	}
	bill := billable(all)
	isLegacy := func(e entry) bool {
		return slices.ContainsFunc(legacy, func(l entry) bool { return l.id == e.id })
	}
	base := Finding{CustomerID: k.customer, BillingPeriod: k.period}
	if ok {
		base.IdempotencyKey = r.IdempotencyKey
	}
	mk := func(kind Kind, e entry, canonical, detail string) Finding {
		f := base
		f.Kind, f.Subject, f.ChargeID, f.CanonicalChargeID = kind, e.id, e.id, canonical
		f.StripeCustomerID, f.AmountCents, f.Currency, f.Detail = e.stripeCustomer, e.net(), e.currency, detail
		if f.IdempotencyKey == "" {
			f.IdempotencyKey = e.idemKey
		}
		if isLegacy(e) {
			f.Legacy = true
			if kind == KindDuplicate {
				f.Detail = "legacy (unmarked) " + detail
			}
		}
		return f
	}

	for _, e := range es {
		if e.disputed {
			f := mk(KindDisputed, e, "", "")
			fs = append(fs, disputedFinding(f, e))
		}
	}

	// A processing row names its debit's pending charge: once that charge
	// succeeded at Stripe it is the row's charge, even before the ledger
	// has caught up with the settlement (a poll or webhook away).
	charged := ok && (r.Status == ledger.StatusCharged || r.Status == ledger.StatusProcessing &&
		slices.ContainsFunc(es, func(e entry) bool { return e.id == r.ChargeID || e.intent != "" && e.intent == r.PaymentIntentID }))
	canonical := ""
	var dups []entry
	switch {
	case charged:
		canonical = r.ChargeID
		var ledgerCharge *entry
		for i := range es {
			if es[i].id == r.ChargeID || (es[i].intent != "" && (es[i].intent == r.ChargeID || es[i].intent == r.PaymentIntentID)) {
				ledgerCharge = &es[i]
			}
		}
		if ledgerCharge != nil {
			canonical = ledgerCharge.id
			if e := *ledgerCharge; r.Currency != "" && (e.amount != r.AmountCents || !strings.EqualFold(e.currency, r.Currency)) {
				fs = append(fs, mk(KindAmountMismatch, e, "", fmt.Sprintf("Stripe charged %d %s, the ledger recorded %d %s",
					e.amount, e.currency, r.AmountCents, r.Currency)))
			}
		}
		switch {
		case ledgerCharge == nil || ledgerCharge.net() > 0:
			// The ledger's charge stands (seen here, or created before the
			// listing: a redelivery a day later lands in a later window).
			for _, e := range bill {
				if e.id != canonical {
					dups = append(dups, e)
				}
			}
		case len(bill) > 0:
			// The ledger's charge was refunded: the customer has paid only
			// if one other charge stands, so the earliest one is kept.
			canonical, dups = bill[0].id, bill[1:]
		}
	case len(bill) > 0:
		canonical, dups = bill[0].id, bill[1:]
		why := "no ledger row for this customer and period"
		if ok {
			why = fmt.Sprintf("the ledger row is %s, not charged", r.Status)
		}
		if !isLegacy(bill[0]) {
			fs = append(fs, mk(KindOrphan, bill[0], "", why))
		}
	}
	for _, e := range dups {
		fs = append(fs, mk(KindDuplicate, e, canonical, dupDetail(e, canonical)))
	}
	return fs
}

// disputedFinding makes f (which carries the group's fields) the disputed
// finding of the pelguard charge e: a dispute moves the charge's money
// whatever the ledger says, so it is reported on its own, once per charge.
func disputedFinding(f Finding, e entry) Finding {
	f.Kind, f.Subject, f.ChargeID, f.CanonicalChargeID = KindDisputed, e.id, e.id, ""
	f.StripeCustomerID, f.AmountCents, f.Currency = e.stripeCustomer, e.net(), e.currency
	if f.IdempotencyKey == "" {
		f.IdempotencyKey = e.idemKey
	}
	f.Detail = "the customer disputed this charge at Stripe; answer the dispute in the Dashboard, and refund nothing of this period until it closes"
	return f
}

func dupDetail(e entry, canonical string) string {
	d := "second charge for the period; canonical " + canonical
	if e.refunded > 0 {
		d += fmt.Sprintf("; partly refunded (%d of %d), the rest is due back", e.refunded, e.amount)
	}
	return d
}
