package audit

import (
	"fmt"
	"strings"

	"github.com/pelguard/pelguard/internal/ledger"
)

// Which key an old consumer's charge belongs to (issue 25). A legacy charge
// carries a Stripe customer and a period, never the team's customer: the
// ledger and the stream knowing one team customer on that Stripe customer
// does not prove that no other pays with it (a customer the old consumer
// charged and died before its INSERT is known to nobody). So:
//   - a legacy charge whose amount or currency differs from what the key
//     owes is not that key's second charge: it may be another customer's
//     only one. It is an ambiguous_legacy finding, shown, never refunded;
//   - one of the same amount and currency joins a key only when something
//     names exactly one team customer on the Stripe customer (the ledger,
//     which holds the team's imported table, or the stream's charges);
//     with several named it is ambiguous (splitLegacy). With none named,
//     the old consumer's charges are compared among themselves by amount
//     and currency (the drill's naive run relies on it).

// sameMoney reports whether e is for amount in currency.
func sameMoney(e entry, amount int64, currency string) bool {
	return e.amount == amount && strings.EqualFold(e.currency, currency)
}

// owed is what the pelguard group k owes for its period: its ledger row's
// amount and currency, else those of its earliest pelguard charge. ok is
// false when neither says (every charge refunded and no row).
func owed(es []entry, r ledger.Record, hasRow bool) (int64, string, bool) {
	if hasRow && r.Currency != "" {
		return r.AmountCents, r.Currency, true
	}
	if bill := billable(es); len(bill) > 0 {
		return bill[0].amount, bill[0].currency, true
	}
	return 0, "", false
}

// matchLegacy keeps, of the legacy charges that joined the pelguard group
// k, those of the amount and currency the key owes; every other billable
// one is an ambiguous_legacy finding.
func matchLegacy(k groupKey, es, legacy []entry, r ledger.Record, hasRow bool) ([]entry, []Finding) {
	if len(legacy) == 0 {
		return nil, nil
	}
	amount, currency, known := owed(es, r, hasRow)
	var keep []entry
	var fs []Finding
	for _, e := range legacy {
		switch {
		case known && sameMoney(e, amount, currency):
			keep = append(keep, e)
		case e.net() > 0:
			fs = append(fs, ambiguousLegacy(k.period, e, "", fmt.Sprintf(
				"legacy (unmarked) charge of %s on %s; %s owes %s for the period, so it is not %s's second charge "+
					"and may be the only charge of another of the team's customers who pays with %s: "+
					"check by hand, never refunded automatically",
				money(e.amount, e.currency), e.stripeCustomer, k.customer, money(amount, currency), k.customer, e.stripeCustomer)))
		}
	}
	return keep, fs
}

// ambiguousLegacy is the finding of a legacy charge nothing ties to one
// team customer: no customer on it, so no refund path takes it.
func ambiguousLegacy(period string, e entry, canonical, detail string) Finding {
	return Finding{Kind: KindAmbiguousLegacy, Legacy: true, Subject: e.id, BillingPeriod: period,
		StripeCustomerID: e.stripeCustomer, ChargeID: e.id, CanonicalChargeID: canonical,
		AmountCents: e.net(), Currency: e.currency, Detail: detail}
}
