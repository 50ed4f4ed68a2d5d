package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pelguard/pelguard/internal/ledger"
)

// pelguardFindings joins the marked charges with their ledger rows, one
// LookupBatch of keys per query, and derives duplicate, orphan and
// mismatch findings.
func (a *Auditor) pelguardFindings(ctx context.Context, c *collector) ([]Finding, error) {
	var fs []Finding
	for _, e := range c.unkeyed {
		fs = append(fs, Finding{Kind: KindOrphan, Subject: e.id, StripeCustomerID: e.stripeCustomer, ChargeID: e.id,
			IdempotencyKey: e.idemKey, AmountCents: e.net(), Currency: e.currency,
			Detail: "marked pelguard=1 but has no customer_id/billing_period metadata"})
	}
	keys := make([]ledger.Key, 0, min(len(c.pelguard), a.cfg.LookupBatch))
	flush := func() error {
		recs, err := a.ledger.Lookup(ctx, keys)
		if err != nil {
			return fmt.Errorf("reading the ledger rows of %d charged keys: %w", len(keys), err)
		}
		for _, k := range keys {
			r, ok := recs[k]
			fs = append(fs, groupFindings(groupKey{k.CustomerID, k.BillingPeriod}, c.pelguard[groupKey{k.CustomerID, k.BillingPeriod}], r, ok)...)
		}
		keys = keys[:0]
		return nil
	}
	for k := range c.pelguard {
		keys = append(keys, ledger.Key{CustomerID: k.customer, BillingPeriod: k.period})
		if len(keys) == a.cfg.LookupBatch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if len(keys) > 0 {
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// groupFindings decides one (customer, period) of pelguard charges against
// its ledger row (ok=false: no row).
//
// The canonical charge is the ledger's charge_id when the row is charged,
// else the earliest billable charge. Fully refunded charges take no part: a
// refund already undid them. A partly refunded charge still counts, for
// what it still holds.
func groupFindings(k groupKey, es []entry, r ledger.Record, ok bool) []Finding {
	var fs []Finding
	bill := billable(es)
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
		return f
	}

	charged := ok && r.Status == ledger.StatusCharged
	canonical := ""
	var dups []entry
	switch {
	case charged:
		canonical = r.ChargeID
		var ledgerCharge *entry
		for i := range es {
			if es[i].id == canonical {
				ledgerCharge = &es[i]
			}
		}
		if ledgerCharge != nil {
			if e := *ledgerCharge; e.amount != r.AmountCents || !strings.EqualFold(e.currency, r.Currency) {
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
		fs = append(fs, mk(KindOrphan, bill[0], "", why))
	}
	for _, e := range dups {
		fs = append(fs, mk(KindDuplicate, e, canonical, dupDetail(e, canonical)))
	}
	return fs
}

func dupDetail(e entry, canonical string) string {
	d := "second charge for the period; canonical " + canonical
	if e.refunded > 0 {
		d += fmt.Sprintf("; partly refunded (%d of %d), the rest is due back", e.refunded, e.amount)
	}
	return d
}

// legacyFindings reports only duplicates among unmarked charges: without a
// ledger there is nothing else to compare with.
func legacyFindings(groups map[groupKey][]entry) []Finding {
	var fs []Finding
	for k, es := range groups {
		bill := billable(es)
		if len(bill) < 2 {
			continue
		}
		canonical := bill[0].id
		for _, e := range bill[1:] {
			fs = append(fs, Finding{Kind: KindDuplicate, Subject: e.id, Legacy: true, BillingPeriod: k.period,
				StripeCustomerID: k.customer, ChargeID: e.id, CanonicalChargeID: canonical,
				AmountCents: e.net(), Currency: e.currency,
				Detail: "legacy (unmarked) " + dupDetail(e, canonical)})
		}
	}
	return fs
}
