package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pelguard/pelguard/internal/ledger"
)

// Legacy grouping that cannot refund the wrong customer (issue 17): in B2B
// one Stripe customer often pays for several of the team's customers. The
// old consumer's charges carry no customer_id, so grouping them by Stripe
// customer and period would call one customer's charge a duplicate of
// another's, and refund it. Where the ledger (rows of any period, such as
// those `consumer import` brought from the team's table) or the stream
// (pelguard's charges this period) maps several customer_ids to one Stripe
// customer, the legacy charges are split by the team's customer, telling
// them apart by amount; what nothing tells apart is an ambiguous_legacy
// finding, which no refund path takes.

// teamCustomer is one of the team's customers billed to a Stripe customer.
type teamCustomer struct {
	id     string
	amount int64
}

// teamMap lists, by Stripe customer id, the team's customers billed to it.
type teamMap map[string][]teamCustomer

func (t teamMap) add(stripeID string, tc teamCustomer) {
	for _, x := range t[stripeID] {
		if x.id == tc.id {
			return
		}
	}
	t[stripeID] = append(t[stripeID], tc)
}

// teamCustomers reads, for the Stripe customers of the legacy groups, the
// team's customers the ledger (any period, latest amount) and the stream
// (t, this listing's pelguard groups: see sharing) bill to each. Like
// ByStripeKeys, no index serves the ledger read; only --legacy runs make
// it, one query per LookupBatch Stripe customers.
func (a *Auditor) teamCustomers(ctx context.Context, c *collector, t teamMap) (teamMap, error) {
	if len(c.legacy) == 0 {
		return nil, nil
	}
	if t == nil {
		t = teamMap{}
	}
	var ids []string
	for k := range c.legacy {
		if !slices.Contains(ids, k.customer) {
			ids = append(ids, k.customer)
		}
	}
	for start := 0; start < len(ids); start += a.cfg.LookupBatch {
		part := ids[start:min(start+a.cfg.LookupBatch, len(ids))]
		rows, err := a.store.pool.Query(ctx, `SELECT DISTINCT ON (stripe_customer_id, customer_id)
				stripe_customer_id, customer_id, amount_cents
			FROM {schema}.billing_records WHERE stripe_customer_id = ANY($1::text[])
			ORDER BY stripe_customer_id, customer_id, updated_at DESC`, part)
		if err != nil {
			return nil, fmt.Errorf("reading the team's customers of %d Stripe customers: %w", len(part), err)
		}
		for rows.Next() {
			var s string
			var tc teamCustomer
			if err := rows.Scan(&s, &tc.id, &tc.amount); err != nil {
				rows.Close()
				return nil, fmt.Errorf("reading the team's customers: %w", err)
			}
			t.add(s, tc)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("reading the team's customers of %d Stripe customers: %w", len(part), err)
		}
	}
	return t, nil
}

// splitLegacy decides the legacy charges of one Stripe customer and period
// (k) that stands for several team customers (team), with the ledger's
// rows of that Stripe customer and period. Only the listed charges are
// compared (the ledger's charge of one of them says nothing about whose an
// unmarked charge is), grouped by amount, each customer's amount being
// this period's row's (a customer without one makes the split ambiguous). A group of one charge is no
// finding. In a group whose amount exactly one team customer pays, the
// later charges are that customer's duplicates of the earliest. Any other
// group of several charges is ambiguous (ambiguous_legacy, never
// refunded): each may be the only charge of a different customer.
func splitLegacy(k groupKey, es []entry, rows []ledger.Record, team []teamCustomer) []Finding {
	// Only this period's rows tell what a customer owes now: an amount
	// from another period is no proof, and a customer with no row this
	// period might owe any amount, which makes every group ambiguous.
	amounts := map[string]int64{}
	for _, r := range rows {
		amounts[r.CustomerID] = r.AmountCents
	}
	unknown := false
	for _, tc := range team {
		if _, ok := amounts[tc.id]; !ok {
			unknown = true
		}
	}
	ids := make([]string, len(team))
	for i, tc := range team {
		ids[i] = tc.id
	}
	// Charges of one amount in two currencies are never one customer's
	// duplicates.
	type price struct {
		amount   int64
		currency string
	}
	byAmount := map[price][]entry{}
	var order []price
	for _, e := range billable(es) {
		p := price{e.amount, strings.ToLower(e.currency)}
		if byAmount[p] == nil {
			order = append(order, p)
		}
		byAmount[p] = append(byAmount[p], e)
	}
	var fs []Finding
	base := Finding{Legacy: true, BillingPeriod: k.period, StripeCustomerID: k.customer}
	for _, p := range order {
		amt, g := p.amount, byAmount[p]
		if len(g) < 2 {
			continue
		}
		var who []string
		for _, tc := range team {
			if amounts[tc.id] == amt {
				who = append(who, tc.id)
			}
		}
		canonical := g[0].id
		for _, e := range g[1:] {
			f := base
			f.Subject, f.ChargeID, f.CanonicalChargeID = e.id, e.id, canonical
			f.AmountCents, f.Currency = e.net(), e.currency
			if len(who) == 1 && !unknown {
				f.Kind, f.CustomerID = KindDuplicate, who[0]
				f.Detail = fmt.Sprintf("legacy (unmarked) %s; of the team's customers on %s, only %s pays this amount",
					dupDetail(e, canonical), k.customer, who[0])
			} else {
				f.Kind = KindAmbiguousLegacy
				f.Detail = fmt.Sprintf("legacy (unmarked) charge of the same amount as %s on %s, which bills %d of the team's customers (%s) "+
					"for the period; nothing tells whether it is a second charge of one or the only charge of another: "+
					"check by hand, never refunded automatically", canonical, k.customer, len(team), strings.Join(ids, ", "))
			}
			fs = append(fs, f)
		}
	}
	return fs
}
