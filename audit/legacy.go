package audit

import (
	"context"
	"fmt"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// recorded maps charge and PaymentIntent ids to the ledger rows that record
// them: the rows of one page's unmarked charges.
type recorded map[string]ledger.Record

// of returns the row that records ch, by its charge id or its intent id.
func (k recorded) of(ch *stripeapi.Charge) (ledger.Record, bool) {
	if r, ok := k[ch.ID]; ok {
		return r, true
	}
	if ch.PaymentIntentID == "" {
		return ledger.Record{}, false
	}
	r, ok := k[ch.PaymentIntentID]
	return r, ok
}

// file reads the ledger rows of a page's unmarked charges, in one query per
// page, and files the page into c. A charge without pelguard's marker may
// still be the ledger's: pelguard charging with its metadata turned off (so
// that Stripe accepts a team's idempotency key), or a team's charge brought
// in by `consumer import`. Reading per page keeps the rows of one page in
// memory, never the window's.
func (a *Auditor) file(ctx context.Context, c *collector, page []stripeapi.Charge) error {
	var ids []string
	for i := range page {
		ch := &page[i]
		if (ch.Status != "succeeded" && ch.Status != "pending") || stripeapi.IsPelguard(ch.Metadata) {
			continue
		}
		ids = append(ids, ch.ID)
		if ch.PaymentIntentID != "" {
			ids = append(ids, ch.PaymentIntentID)
		}
	}
	var known recorded
	if len(ids) > 0 {
		rows, err := a.byChargeIDs(ctx, ids)
		if err != nil {
			return fmt.Errorf("reading the ledger rows of unmarked charges: %w", err)
		}
		known = rows
	}
	if err := a.stageRows(ctx, c.runID, c.add(page, known)); err != nil {
		return err
	}
	c.scanned.Add(int64(len(page)))
	return nil
}

// addUnmarked files a succeeded charge without pelguard's marker (c.mu held)
// and returns its stage row. A charge the ledger records is pelguard's,
// whatever its metadata: it goes to its row's group, where it is the
// canonical charge. Any other is a legacy charge, kept (in memory) only
// with --legacy, under its Stripe customer and the period of its metadata
// or description.
func (c *collector) addUnmarked(ch *stripeapi.Charge, e entry, known recorded) stageRow {
	seen := stageRow{grp: stageSeen, e: e}
	if r, ok := known.of(ch); ok {
		c.pelguardN.Add(1)
		if c.period != "" && r.BillingPeriod != c.period {
			return seen
		}
		e.idemKey = r.IdempotencyKey
		return stageRow{grp: stagePelguard, k: groupKey{r.CustomerID, r.BillingPeriod}, e: e}
	}
	if c.legacyRE == nil || ch.StripeCustomerID == "" {
		return seen
	}
	period := ch.Metadata[stripeapi.MetaBillingPeriod]
	if period == "" {
		m := c.legacyRE.FindStringSubmatch(ch.Description)
		if len(m) < 2 || m[1] == "" {
			return seen
		}
		period = m[1]
	}
	if c.period != "" && period != c.period {
		return seen
	}
	c.legacyN.Add(1)
	k := groupKey{ch.StripeCustomerID, c.intern(period)}
	e.currency = c.intern(e.currency)
	c.legacy[k] = append(c.legacy[k], e)
	return seen
}

// stripeCustomers calls fn once for each Stripe customer of es.
func stripeCustomers(es []entry, fn func(string)) {
	for i, e := range es {
		seen := e.stripeCustomer == ""
		for _, p := range es[:i] {
			seen = seen || p.stripeCustomer == e.stripeCustomer
		}
		if !seen {
			fn(e.stripeCustomer)
		}
	}
}

// sharing counts, for each (Stripe customer, period) that has legacy
// charges, the pelguard groups billed to that Stripe customer in that
// period, and lists by Stripe customer the team customers of those groups
// (the stream's half of teamCustomers). Legacy charges join a pelguard
// group only when it is the one group of their key: with two ledger
// customers on one Stripe customer the auditor cannot tell which of them an
// old charge billed. The pelguard groups are read from the stage,
// LookupBatch legacy keys per query.
func (a *Auditor) sharing(ctx context.Context, c *collector) (map[groupKey]int, teamMap, error) {
	if len(c.legacy) == 0 {
		return nil, nil, nil
	}
	n, t := map[groupKey]int{}, teamMap{}
	keys := make([]groupKey, 0, min(len(c.legacy), a.cfg.LookupBatch))
	flush := func() error {
		err := a.store.stagedShares(ctx, c.runID, keys, func(s, period, customer string) {
			n[groupKey{s, period}]++
			t.add(s, teamCustomer{id: customer})
		})
		keys = keys[:0]
		return err
	}
	for k := range c.legacy {
		keys = append(keys, k)
		if len(keys) == a.cfg.LookupBatch {
			if err := flush(); err != nil {
				return nil, nil, err
			}
		}
	}
	if len(keys) > 0 {
		if err := flush(); err != nil {
			return nil, nil, err
		}
	}
	return n, t, nil
}

// takeLegacy removes from c and returns the legacy charges that belong with
// the pelguard group k: those of its Stripe customers and period that no
// other pelguard group shares.
//
// Nor do they join unless the team's customers (team) name exactly one on
// that Stripe customer: the old charge may be another customer's only
// charge, and joining would make it a refundable duplicate of this
// group's. Those that join are then matched by amount (matchLegacy).
func (c *collector) takeLegacy(k groupKey, es []entry, shared map[groupKey]int, team teamMap) []entry {
	if len(shared) == 0 {
		return nil
	}
	var out []entry
	stripeCustomers(es, func(s string) {
		sk := groupKey{s, k.period}
		if shared[sk] == 1 && len(team[s]) == 1 {
			out = append(out, c.legacy[sk]...)
			delete(c.legacy, sk)
		}
	})
	return out
}

// legacyFindings decides the legacy groups that joined no pelguard group,
// against the ledger rows of their Stripe customer and period, LookupBatch
// keys per query. A group shared by several pelguard groups is compared
// among its unmarked charges only, without the ledger.
//
// A Stripe customer that stands for several of the team's customers (team)
// is split by customer instead (splitLegacy), with the period's rows.
func (a *Auditor) legacyFindings(ctx context.Context, groups map[groupKey][]entry, shared map[groupKey]int, team teamMap) ([]Finding, error) {
	var fs []Finding
	keys := make([]ledger.StripeKey, 0, min(len(groups), a.cfg.LookupBatch))
	flush := func() error {
		rows, err := a.ledger.ByStripeKeys(ctx, keys)
		if err != nil {
			return fmt.Errorf("reading the ledger rows of %d legacy groups: %w", len(keys), err)
		}
		for _, sk := range keys {
			k := groupKey{sk.StripeCustomerID, sk.BillingPeriod}
			if tc := team[k.customer]; len(tc) > 1 {
				fs = append(fs, splitLegacy(k, groups[k], rows[sk], tc)...)
				continue
			}
			fs = append(fs, legacyGroupFindings(k, groups[k], rows[sk], 0, team[k.customer], a.cfg.OneCustomerPerStripeCustomer)...)
		}
		keys = keys[:0]
		return nil
	}
	for k, es := range groups {
		if n := shared[k]; n > 1 && len(team[k.customer]) < 2 {
			fs = append(fs, legacyGroupFindings(k, es, nil, n, team[k.customer], a.cfg.OneCustomerPerStripeCustomer)...)
			continue
		}
		keys = append(keys, ledger.StripeKey{StripeCustomerID: k.customer, BillingPeriod: k.period})
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

// legacyGroupFindings reports the duplicates among the legacy charges of one
// Stripe customer and period that no pelguard charge of the window joined.
// rows are the ledger's rows for that key; shared > 1 says that many
// pelguard groups bill it (rows is then nil); team lists the team's
// customers known on the Stripe customer (any period).
//
// With exactly one row, its customer goes on the findings and, when it is
// charged, its charge is the canonical one: it was not listed in this
// window (a listed charge of the ledger's is in a pelguard group), so a
// legacy charge here of its amount is a second charge. Otherwise the
// earliest billable charge is canonical. A charge of another amount or
// currency than the canonical's (the row's, with one), or any second charge
// when several team customers are known on the Stripe customer, is
// ambiguous_legacy (legacy_match.go).
func legacyGroupFindings(k groupKey, es []entry, rows []ledger.Record, shared int, team []teamCustomer, oneToOne bool) []Finding {
	bill := billable(es)
	base := Finding{Kind: KindDuplicate, Legacy: true, BillingPeriod: k.period, StripeCustomerID: k.customer}
	note, unsure := "", ""
	switch {
	case shared > 1:
		unsure = fmt.Sprintf("pelguard bills %d customers on %s for the period", shared, k.customer)
	case len(rows) > 1:
		unsure = fmt.Sprintf("the ledger has %d customers on %s for the period", len(rows), k.customer)
	case len(team) > 1:
		unsure = fmt.Sprintf("%s stands for %d of the team's customers", k.customer, len(team))
	case len(rows) == 1:
		base.CustomerID, base.IdempotencyKey = rows[0].CustomerID, rows[0].IdempotencyKey
	case len(team) == 1:
		base.CustomerID = team[0].id
	case !oneToOne:
		// Nothing known at all (no row, no pelguard charge on the Stripe
		// customer: an old consumer's charges alone): two charges of one
		// amount may be one customer charged twice or two of the team's
		// customers on one plan, each charged once. Only the operator can
		// say which (Config.OneCustomerPerStripeCustomer).
		unsure = fmt.Sprintf("nothing pelguard knows says how many of the team's customers %s pays for "+
			"(if each Stripe customer pays for one, say so: --one-customer-per-stripe-customer)", k.customer)
	}
	// With OneCustomerPerStripeCustomer, nothing known is compared among
	// the charges themselves: two charges of one amount on one Stripe
	// customer and period are one customer's duplicate.
	var canonical string
	var amount int64
	var currency string
	switch {
	case len(rows) == 1 && rows[0].Status == ledger.StatusCharged:
		canonical, amount, currency = rows[0].ChargeID, rows[0].AmountCents, rows[0].Currency
		note = "; the ledger's charge was not listed in the window"
		for _, e := range bill {
			if e.id == canonical || e.intent == canonical {
				// Recorded since the page was read (an import running
				// beside the audit): it is the ledger's, not a duplicate.
				canonical, note = e.id, ""
			}
		}
	case len(bill) > 0:
		canonical, amount, currency = bill[0].id, bill[0].amount, bill[0].currency
		if len(rows) == 1 {
			// What the key owes, not the earliest charge, says which
			// charges may be its own.
			canonical, amount, currency = "", rows[0].AmountCents, rows[0].Currency
			for _, e := range bill {
				if sameMoney(e, amount, currency) {
					canonical = e.id
					break
				}
			}
		}
	}
	var fs []Finding
	for _, e := range bill {
		if e.id == canonical {
			continue
		}
		switch {
		case !sameMoney(e, amount, currency):
			ref := "the canonical charge " + canonical + " is"
			if len(rows) == 1 {
				ref = "the ledger's " + rows[0].CustomerID + " owes"
			}
			fs = append(fs, ambiguousLegacy(k.period, e, canonical, fmt.Sprintf(
				"legacy (unmarked) charge of %s on %s, where %s %s: another amount or currency is not a second charge of the same "+
					"customer and may be the only charge of another of the team's customers: check by hand, never refunded automatically",
				money(e.amount, e.currency), k.customer, ref, money(amount, currency))))
		case unsure != "":
			fs = append(fs, ambiguousLegacy(k.period, e, canonical, fmt.Sprintf(
				"legacy (unmarked) charge of the same amount as %s, but %s: nothing tells whether it is a second charge of one "+
					"customer or the only charge of another: check by hand, never refunded automatically", canonical, unsure)))
		default:
			f := base
			f.Subject, f.ChargeID, f.CanonicalChargeID = e.id, e.id, canonical
			f.AmountCents, f.Currency = e.net(), e.currency
			f.Detail = "legacy (unmarked) " + dupDetail(e, canonical) + note
			fs = append(fs, f)
		}
	}
	return fs
}
