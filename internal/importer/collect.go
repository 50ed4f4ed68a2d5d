package importer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// collect reads the team's rows, the events and Stripe's charges into keys.
func (r *run) collect(ctx context.Context) error {
	rows, err := r.teamRows(ctx)
	if err != nil {
		return err
	}
	r.sum.TeamRows = len(rows)
	r.progress("read %d rows of the team's table", len(rows))

	// Stripe customer → the team's customer ids, from the events and (below)
	// from the charges the team's table names.
	owners := map[string]map[string]bool{}
	own := func(stripeCustomer, customer string) {
		if owners[stripeCustomer] == nil {
			owners[stripeCustomer] = map[string]bool{}
		}
		owners[stripeCustomer][customer] = true
	}
	for i := range r.cfg.Events {
		ev := &r.cfg.Events[i]
		if r.cfg.Period != "" && ev.BillingPeriod != r.cfg.Period {
			continue
		}
		r.get(ledger.EventKey(*ev)).event = ev
		own(ev.StripeCustomerID, ev.CustomerID)
	}

	for i := range rows {
		row := &rows[i]
		k := ledger.Key{CustomerID: row.CustomerID, BillingPeriod: row.BillingPeriod}
		e := r.get(k)
		e.team = row
		if row.ChargeID == nil || *row.ChargeID == "" {
			continue
		}
		ch, err := r.cfg.Stripe.GetCharge(ctx, *row.ChargeID)
		switch {
		case errors.Is(err, stripeapi.ErrNoSuchCharge):
			e.problems = append(e.problems, "the team's table names charge "+*row.ChargeID+", which Stripe does not have")
			continue
		case err != nil:
			return fmt.Errorf("verifying %s's charge %s at Stripe: %w", k, *row.ChargeID, err)
		}
		if why := r.mismatch(row, e, ch); why != "" {
			e.problems = append(e.problems, why)
			continue
		}
		e.teamCh = ch.ID
		e.charges = appendCharge(e.charges, ch)
		own(ch.StripeCustomerID, row.CustomerID)
		if (i+1)%1000 == 0 {
			r.progress("verified %d of %d rows at Stripe", i+1, len(rows))
		}
	}

	if !r.cfg.FromStripe {
		return nil
	}
	from, _ := time.Parse("2006-01", r.cfg.Period) // validated
	want := strings.ReplaceAll(r.cfg.Description, "{period}", r.cfg.Period)
	var listed int
	// No real upper bound: every charge from the period's start on (a
	// month past now also covers a host clock behind Stripe's).
	err = r.cfg.Stripe.ListCharges(ctx, from, r.cfg.Now().AddDate(0, 1, 0), func(ch stripeapi.Charge) error {
		listed++
		if listed%10000 == 0 {
			r.progress("listed %d charges at Stripe", listed)
		}
		if ch.Status != "succeeded" {
			return nil
		}
		if stripeapi.IsPelguard(ch.Metadata) {
			// pelguard's own charge: after a ledger restore it is as
			// unknown to the ledger as a team's.
			return r.pelguardCharge(ch)
		}
		period := ch.Metadata[stripeapi.MetaBillingPeriod]
		if period == "" && ch.Description == want {
			period = r.cfg.Period
		}
		if period != r.cfg.Period {
			return nil
		}
		r.sum.StripeCharges++
		customer := ch.Metadata[stripeapi.MetaCustomerID]
		if customer == "" {
			// Only a customer known to owe exactly this amount, in this
			// currency, for this period may own the charge: a Stripe
			// customer can pay for several of the team's customers (B2B),
			// and a charge filed under the wrong one would become a
			// "duplicate" that refunds another customer's only payment
			// (the auditor's --legacy follows the same rule).
			ids := owners[ch.StripeCustomerID]
			var match []string
			for id := range ids {
				k := ledger.Key{CustomerID: id, BillingPeriod: period}
				amt, ok := r.amountOf(k)
				if cur := r.currencyOf(k); ok && amt == ch.AmountCents && (cur == "" || strings.EqualFold(cur, ch.Currency)) {
					match = append(match, id)
				}
			}
			switch {
			case len(ids) == 0:
				r.skip(ledger.Key{BillingPeriod: period}, ch.ID, "no customer_id for Stripe customer "+ch.StripeCustomerID+
					" (neither the team's table nor the stream's events name it): not imported")
				return nil
			case len(match) != 1:
				r.skip(ledger.Key{BillingPeriod: period}, ch.ID, fmt.Sprintf("Stripe customer %s stands for %d of the team's customers and %d of them owe %d %s for %s: "+
					"which one this charge bills cannot be told, not imported (pelguard asks Stripe before charging any key of the period)",
					ch.StripeCustomerID, len(ids), len(match), ch.AmountCents, ch.Currency, period))
				return nil
			}
			customer = match[0]
		}
		e := r.get(ledger.Key{CustomerID: customer, BillingPeriod: period})
		e.charges = appendCharge(e.charges, ch)
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing %s's charges at Stripe: %w", r.cfg.Period, err)
	}
	r.progress("listed %d charges at Stripe, %d of them charges of %s", listed, r.sum.StripeCharges, r.cfg.Period)
	return nil
}

// amountOf is what the key owes, by its stream event or the team's row.
func (r *run) amountOf(k ledger.Key) (int64, bool) {
	e, ok := r.keys[k]
	switch {
	case !ok:
		return 0, false
	case e.event != nil:
		return e.event.AmountCents, true
	case e.team != nil && e.team.AmountCents != nil:
		return *e.team.AmountCents, true
	}
	return 0, false
}

// currencyOf is the key's currency, by its stream event or the charge its
// team's row names (verified at Stripe); "" when neither says (a declined
// row without an event: its amount alone is known).
func (r *run) currencyOf(k ledger.Key) string {
	e, ok := r.keys[k]
	switch {
	case !ok:
		return ""
	case e.event != nil && e.event.Currency != "":
		return e.event.Currency
	}
	for _, ch := range e.charges {
		if ch.ID == e.teamCh {
			return ch.Currency
		}
	}
	return ""
}

// pelguardCharge adds a charge pelguard made (its marker names the key).
func (r *run) pelguardCharge(ch stripeapi.Charge) error {
	md := ch.Metadata
	k := ledger.Key{CustomerID: md[stripeapi.MetaCustomerID], BillingPeriod: md[stripeapi.MetaBillingPeriod]}
	if k.BillingPeriod != r.cfg.Period || k.CustomerID == "" {
		return nil
	}
	r.sum.StripeCharges++
	if want := event.IdempotencyKey(k.CustomerID, k.BillingPeriod, r.cfg.Namespace); md[stripeapi.MetaIdempotencyKey] != want {
		r.skip(k, ch.ID, "a pelguard charge made under another --namespace (its key differs): not imported; rerun with that namespace")
		return nil
	}
	e := r.get(k)
	e.charges = appendCharge(e.charges, ch)
	return nil
}

// mismatch says why a charge the team's table names cannot be the key's
// charge, or "".
func (r *run) mismatch(row *TeamRow, e *keyed, ch stripeapi.Charge) string {
	switch {
	case ch.Status != "succeeded":
		return fmt.Sprintf("charge %s is %s at Stripe, not succeeded", ch.ID, ch.Status)
	case row.AmountCents != nil && *row.AmountCents != ch.AmountCents:
		return fmt.Sprintf("charge %s is %d %s at Stripe; the team's row says %d", ch.ID, ch.AmountCents, ch.Currency, *row.AmountCents)
	case e.event != nil && e.event.StripeCustomerID != ch.StripeCustomerID:
		return fmt.Sprintf("charge %s belongs to Stripe customer %s; the stream's event says %s", ch.ID, ch.StripeCustomerID, e.event.StripeCustomerID)
	case e.event != nil && !strings.EqualFold(e.event.Currency, ch.Currency):
		return fmt.Sprintf("charge %s is in %s; the stream's event says %s", ch.ID, ch.Currency, e.event.Currency)
	}
	return ""
}

func appendCharge(chs []stripeapi.Charge, ch stripeapi.Charge) []stripeapi.Charge {
	for _, c := range chs {
		if c.ID == ch.ID {
			return chs
		}
	}
	return append(chs, ch)
}

// teamRows reads the team's table and query in READ ONLY transactions: the
// import cannot write the team's data even by mistake.
func (r *run) teamRows(ctx context.Context) ([]TeamRow, error) {
	var out []TeamRow
	read := func(q string, args ...any) error {
		tx, err := r.cfg.DB.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[TeamRow])
		if err != nil {
			return err
		}
		for _, g := range got {
			if r.cfg.Period == "" || g.BillingPeriod == r.cfg.Period {
				out = append(out, g)
			}
		}
		return nil
	}
	if r.cfg.FromTable != "" {
		id, _ := tableIdent(r.cfg.FromTable) // validated
		q := `SELECT customer_id::text, billing_period::text, charge_id::text, amount_cents::bigint, status::text,
			error::text, created_at::timestamptz FROM ` + id.Sanitize()
		if err := read(q); err != nil {
			return nil, fmt.Errorf("reading %s: %w", r.cfg.FromTable, err)
		}
	}
	if r.cfg.FromQuery != "" {
		if err := read(r.cfg.FromQuery); err != nil {
			return nil, fmt.Errorf("running --from-query (in a READ ONLY transaction): %w", err)
		}
	}
	return out, nil
}
