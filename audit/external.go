package audit

import (
	"context"
	"fmt"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
)

// The auditor over a team that keeps its own consumer (reaper
// --external-ledger): Config.ExternalLedger names the team's table (the
// article's billing_records), and its rows count as ledger rows wherever
// the auditor asks which charge a key's canonical is. The charge that table
// names is never refunded; a second charge of the same Stripe customer and
// period is the duplicate. The table has no Stripe customer column: it is
// joined on charge_id. The team's table is only read.

// teamRecord is a row of the team's table as the ledger's Record: charged
// when it names a charge, declined otherwise. Its currency is left empty
// (the article's table has none), which skips the amount check.
func teamRecord(customer, period string, charge *string, amount *int64) ledger.Record {
	r := ledger.Record{Key: ledger.Key{CustomerID: customer, BillingPeriod: period}, Status: ledger.StatusDeclined}
	if charge != nil && *charge != "" {
		r.Status, r.ChargeID = ledger.StatusCharged, *charge
	}
	if amount != nil {
		r.AmountCents = *amount
	}
	return r
}

func (a *Auditor) teamIdent() (string, error) {
	id, err := pg.TeamTable("--external-ledger", a.cfg.ExternalLedger)
	return id.Sanitize(), err
}

func (a *Auditor) teamRows(ctx context.Context, where string, args ...any) ([]ledger.Record, error) {
	ident, err := a.teamIdent()
	if err != nil {
		return nil, err
	}
	rows, err := a.cfg.DB.Query(ctx, `SELECT customer_id::text, billing_period::text, charge_id::text, amount_cents::bigint
		FROM `+ident+` WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", a.cfg.ExternalLedger, err)
	}
	var out []ledger.Record
	for rows.Next() {
		var c, p string
		var ch *string
		var amt *int64
		if err := rows.Scan(&c, &p, &ch, &amt); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, teamRecord(c, p, ch, amt))
	}
	return out, rows.Err()
}

// byChargeIDs is ledger.ByChargeIDs, plus the team's rows naming those
// charges.
func (a *Auditor) byChargeIDs(ctx context.Context, ids []string) (map[string]ledger.Record, error) {
	out, err := a.ledger.ByChargeIDs(ctx, ids)
	if err != nil || a.cfg.ExternalLedger == "" || len(ids) == 0 {
		return out, err
	}
	team, err := a.teamRows(ctx, `charge_id = ANY($1::text[])`, ids)
	if err != nil {
		return nil, err
	}
	for _, r := range team {
		if _, ok := out[r.ChargeID]; !ok {
			out[r.ChargeID] = r
		}
	}
	return out, nil
}

// lookup is ledger.Lookup, plus the team's rows for keys pelguard's ledger
// does not have.
func (a *Auditor) lookup(ctx context.Context, keys []ledger.Key) (map[ledger.Key]ledger.Record, error) {
	out, err := a.ledger.Lookup(ctx, keys)
	if err != nil || a.cfg.ExternalLedger == "" {
		return out, err
	}
	var cs, ps []string
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			cs, ps = append(cs, k.CustomerID), append(ps, k.BillingPeriod)
		}
	}
	if len(cs) == 0 {
		return out, nil
	}
	team, err := a.teamRows(ctx, `(customer_id::text, billing_period::text) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, cs, ps)
	if err != nil {
		return nil, err
	}
	for _, r := range team {
		out[r.Key] = r
	}
	return out, nil
}

// get is ledger.Get, falling back to the team's row.
func (a *Auditor) get(ctx context.Context, k ledger.Key) (ledger.Record, error) {
	r, err := a.ledger.Get(ctx, k)
	if err == nil || a.cfg.ExternalLedger == "" {
		return r, err
	}
	got, lerr := a.lookup(ctx, []ledger.Key{k})
	if lerr != nil {
		return ledger.Record{}, lerr
	}
	if t, ok := got[k]; ok {
		return t, nil
	}
	return r, err
}
