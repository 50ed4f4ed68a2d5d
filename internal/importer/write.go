package importer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// declined are the statuses a team's row uses for a refused card.
var declined = []string{"card_declined", "declined"}

// decide turns each key into at most one ledger record and its duplicates.
func (r *run) decide() ([]ledger.Record, []Duplicate) {
	var recs []ledger.Record
	var dups []Duplicate
	keys := make([]ledger.Key, 0, len(r.keys))
	for k := range r.keys {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ledger.Key) int { return strings.Compare(a.String(), b.String()) })
	periods := map[string]bool{}
	for _, k := range keys {
		e := r.keys[k]
		if e.team != nil || len(e.charges) > 0 {
			// History seen for this period, imported or not: pelguard
			// cannot prove from its ledger that a key of it was never
			// charged (a row skipped below is exactly such a key).
			periods[k.BillingPeriod] = true
		}
		for _, p := range e.problems {
			r.skip(k, "", p)
		}
		if len(e.charges) == 0 {
			if e.team == nil {
				continue // an event the team never billed: pelguard's to bill
			}
			if rec, ok := r.declinedRecord(e); ok {
				recs = append(recs, rec)
				periods[k.BillingPeriod] = true
			}
			continue
		}
		canonical, ok := stripeapi.Charge{}, false
		if e.teamCh != "" {
			// The charge the team's table names stays the canonical one.
			i := slices.IndexFunc(e.charges, func(c stripeapi.Charge) bool { return c.ID == e.teamCh })
			canonical, ok = e.charges[i], true
		} else {
			canonical, ok = stripeapi.Canonical(e.charges)
		}
		if !ok {
			continue
		}
		e.canon = canonical
		first := canonical.Created
		if e.team != nil && e.team.CreatedAt != nil && e.team.CreatedAt.Before(first) {
			first = *e.team.CreatedAt
		}
		recs = append(recs, ledger.Record{
			Key: k, StripeCustomerID: canonical.StripeCustomerID, AmountCents: canonical.AmountCents,
			Currency: strings.ToLower(canonical.Currency), IdempotencyKey: event.IdempotencyKey(k.CustomerID, k.BillingPeriod, r.cfg.Namespace),
			Status: ledger.StatusCharged, ChargeID: canonical.ID, ChargedAt: canonical.Created, FirstAttemptAt: first,
		})
		periods[k.BillingPeriod] = true
		for _, ch := range e.charges {
			if ch.ID == canonical.ID || ch.AmountCents-ch.AmountRefundedCents <= 0 {
				continue
			}
			dups = append(dups, Duplicate{CustomerID: k.CustomerID, BillingPeriod: k.BillingPeriod, ChargeID: ch.ID,
				CanonicalChargeID: canonical.ID, AmountCents: ch.AmountCents - ch.AmountRefundedCents,
				Currency: ch.Currency, StripeCustomerID: ch.StripeCustomerID})
		}
	}
	if r.cfg.Period != "" {
		periods[r.cfg.Period] = true
	}
	for p := range periods {
		r.sum.Periods = append(r.sum.Periods, p)
	}
	slices.Sort(r.sum.Periods)
	return recs, dups
}

// declinedRecord is a team's row without a charge: declined if it says so
// and the stream's event gives the amount; anything else is reported.
func (r *run) declinedRecord(e *keyed) (ledger.Record, bool) {
	switch {
	case len(e.problems) > 0:
		return ledger.Record{}, false // reported already
	case !slices.Contains(declined, e.team.Status):
		r.skip(e.key, "", fmt.Sprintf("the team's row has status %q and no charge that Stripe confirms: not imported (pelguard will look at Stripe before charging this key)", e.team.Status))
		return ledger.Record{}, false
	case e.event == nil:
		r.skip(e.key, "", "a declined row, but no event on the stream gives its Stripe customer and amount: not imported")
		return ledger.Record{}, false
	}
	first := r.cfg.Now()
	if e.team.CreatedAt != nil {
		first = *e.team.CreatedAt
	}
	msg := "declined before pelguard (imported)"
	if e.team.Error != nil && *e.team.Error != "" {
		msg = *e.team.Error
	}
	return ledger.Record{
		Key: e.key, StripeCustomerID: e.event.StripeCustomerID, AmountCents: e.event.AmountCents, Currency: e.event.Currency,
		IdempotencyKey: event.IdempotencyKey(e.key.CustomerID, e.key.BillingPeriod, r.cfg.Namespace),
		Status:         ledger.StatusDeclined, FirstAttemptAt: first, LastError: msg,
	}, true
}

// write records everything in one transaction per kind of table (the ledger
// rows first): a failure leaves the run unrecorded and a rerun does it all.
func (r *run) write(ctx context.Context, recs []ledger.Record, dups []Duplicate) error {
	r.sum.Duplicates = dups
	if r.cfg.DryRun {
		for _, rec := range recs {
			if rec.Status == ledger.StatusCharged {
				r.sum.ImportedCharged++
			} else {
				r.sum.ImportedDeclined++
			}
		}
		return nil
	}
	l := ledger.New(r.cfg.DB, r.cfg.Schema, nil)
	var runID int64
	if err := r.db.QueryRow(ctx, `INSERT INTO {schema}.import_runs (sources, period) VALUES ($1, nullif($2, '')) RETURNING id`,
		r.sources(), r.cfg.Period).Scan(&runID); err != nil {
		return fmt.Errorf("recording the import run: %w", err)
	}
	r.sum.RunID = runID
	// The periods first, in their own commit: if a ledger chunk below
	// fails, the consumer still asks Stripe before charging any key of
	// them, rather than trusting a half-imported ledger.
	for _, p := range r.sum.Periods {
		if _, err := r.db.Exec(ctx, `INSERT INTO {schema}.imported_periods (billing_period, last_import_id) VALUES ($1, $2)
			ON CONFLICT (billing_period) DO UPDATE SET last_import_id = excluded.last_import_id`, p, runID); err != nil {
			return fmt.Errorf("recording imported period %s: %w", p, err)
		}
	}
	const chunk = 500
	for start := 0; start < len(recs); start += chunk {
		res, err := l.Import(ctx, recs[start:min(start+chunk, len(recs))])
		if err != nil {
			return err
		}
		for i, x := range res {
			rec := recs[start+i]
			switch {
			case x.Inserted && rec.Status == ledger.StatusCharged:
				r.sum.ImportedCharged++
			case x.Inserted:
				r.sum.ImportedDeclined++
			case x.Existing.Key == rec.Key && x.Existing.Status == rec.Status && x.Existing.ChargeID == rec.ChargeID:
				r.sum.AlreadyInLedger++
			case x.Existing.Key == rec.Key && rec.Status == ledger.StatusCharged && x.Existing.Status != ledger.StatusCharged:
				if err := r.repair(ctx, l, rec, x.Existing); err != nil {
					return err
				}
			default:
				r.sum.Conflicts = append(r.sum.Conflicts, Problem{CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, ChargeID: rec.ChargeID,
					Reason: fmt.Sprintf("the ledger already has %s/%s %s (charge %q); left as it is", x.Existing.CustomerID, x.Existing.BillingPeriod, x.Existing.Status, x.Existing.ChargeID)})
			}
		}
		r.progress("wrote %d of %d ledger rows", min(start+chunk, len(recs)), len(recs))
	}
	for _, d := range dups {
		if _, err := r.db.Exec(ctx, `
			INSERT INTO {schema}.audit_findings (kind, subject, legacy, customer_id, billing_period, stripe_customer_id,
				charge_id, canonical_charge_id, idempotency_key, amount_cents, currency, detail, import_run_id)
			VALUES ('duplicate_charge', $1, true, $2, $3, $4, $1, $5, $6, $7, $8,
				'a second charge for this key, made before pelguard (found by consumer import)', $9)
			ON CONFLICT (kind, subject) DO NOTHING`,
			d.ChargeID, d.CustomerID, d.BillingPeriod, d.StripeCustomerID, d.CanonicalChargeID,
			event.IdempotencyKey(d.CustomerID, d.BillingPeriod, r.cfg.Namespace), d.AmountCents, d.Currency, runID); err != nil {
			return fmt.Errorf("recording the duplicate %s: %w", d.ChargeID, err)
		}
	}
	sum, _ := json.Marshal(r.sum)
	_, err := r.db.Exec(ctx, `UPDATE {schema}.import_runs SET finished_at = now(), imported = $2, skipped = $3, conflicts = $4, summary = $5::jsonb
		WHERE id = $1`, runID, r.sum.ImportedCharged+r.sum.ImportedDeclined, len(r.sum.Skipped), len(r.sum.Conflicts)+len(dups), string(sum)) // text, not []byte: exec mode would send bytea
	return err
}

// repair brings in line a row the ledger has as pending or processing (a
// failover took it back from charged, or its charge was never recorded)
// whose key has a charge at Stripe that still holds money: the ledger's
// repair (ledger.Rebuild), fenced like any ledger write. What it cannot
// repair stays a conflict, with the reason.
func (r *run) repair(ctx context.Context, l *ledger.Ledger, rec ledger.Record, existing ledger.Record) error {
	conflict := func(why string) {
		r.sum.Conflicts = append(r.sum.Conflicts, Problem{CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, ChargeID: rec.ChargeID,
			Reason: fmt.Sprintf("the ledger already has %s %s (charge %q): %s", existing.Key, existing.Status, existing.ChargeID, why)})
	}
	ch := r.keys[rec.Key].canon
	if ch.AmountCents-ch.AmountRefundedCents <= 0 {
		conflict("Stripe's charges of the key are fully refunded; left as it is")
		return nil
	}
	attempt := 0 // unknown without pelguard's metadata: the row's stays
	if stripeapi.IsPelguard(ch.Metadata) {
		attempt = 1
		if n, err := strconv.Atoi(ch.Metadata[stripeapi.MetaAttempt]); err == nil && n > 1 {
			attempt = n
		}
	}
	res, err := l.Rebuild(ctx, ledger.RebuiltCharge{Key: rec.Key, StripeCustomerID: ch.StripeCustomerID, AmountCents: ch.AmountCents,
		Currency: rec.Currency, IdempotencyKey: rec.IdempotencyKey, Attempt: attempt, ChargeID: ch.ID,
		PaymentIntentID: ch.PaymentIntentID, Created: ch.Created})
	if err != nil {
		return err
	}
	switch res.Outcome {
	case ledger.RebuildRepaired, ledger.RebuildInserted:
		r.sum.Repaired++
		r.progress("repaired %s: %s → %s with charge %s", rec.Key, existing.Status, res.Record.Status, ch.ID)
	case ledger.RebuildUnchanged:
		r.sum.AlreadyInLedger++
	default:
		conflict(res.Detail)
	}
	return nil
}

func (r *run) sources() string {
	var s []string
	if r.cfg.FromTable != "" {
		s = append(s, "table:"+r.cfg.FromTable)
	}
	if r.cfg.FromQuery != "" {
		s = append(s, "query")
	}
	if r.cfg.FromStripe {
		s = append(s, "stripe")
	}
	return strings.Join(s, ",")
}
