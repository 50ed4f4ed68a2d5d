package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Money in motion (issue 21). A bank debit (ACH, SEPA, Bacs) leaves a
// "pending" charge that succeeds or fails days later, and the ledger row
// that made it is "processing" meanwhile. A run that lists a pending
// charge cannot judge it: it is not a charge yet (no duplicate, no
// orphan), and the row naming it is not missing. Nor may the auditor
// forget it, because its window will not be listed again: the run stages
// it (stagePending) and, once the run has stored its findings, remembers it
// in audit_pending. Every later run reads each remembered charge again at
// Stripe (recheckPending) and files what it finds into its own stage, as if
// the charge's window had listed it: a succeeded charge joins its key's
// group (the ledger's charge now, or a duplicate), a failed one is
// forgotten (failed charges are never charges) and a ledger row claiming
// it charged becomes missing_charge. A charge still pending stays
// remembered. So a window is re-checked until every charge in it is final.

// recheckBatch is how many remembered charges are read again per page.
const recheckBatch = 100

// recheckPending reads again, at Stripe, the remembered pending charges
// that this run's listing did not show, recheckBatch at a time, and files
// them into the run's stage like a listed page.
func (a *Auditor) recheckPending(ctx context.Context, c *collector) (int, error) {
	after, n := "", 0
	for {
		rows, err := a.store.pool.Query(ctx, `SELECT p.charge_id FROM {schema}.audit_pending p
			WHERE p.charge_id > $2
				AND NOT EXISTS (SELECT 1 FROM {schema}.audit_stage s WHERE s.run_id = $1 AND s.charge_id = p.charge_id)
			ORDER BY p.charge_id LIMIT $3`, c.runID, after, recheckBatch)
		if err != nil {
			return n, fmt.Errorf("reading the pending charges to check again: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return n, fmt.Errorf("reading the pending charges to check again: %w", err)
		}
		if len(ids) == 0 {
			return n, nil
		}
		page := make([]stripeapi.Charge, 0, len(ids))
		for _, id := range ids {
			ch, err := a.stripe.GetCharge(ctx, id)
			switch {
			case errors.Is(err, stripeapi.ErrNoSuchCharge):
				// Gone from the account: nothing left to follow.
				ch = stripeapi.Charge{ID: id, Status: "failed"}
			case err != nil:
				return n, fmt.Errorf("checking pending charge %s again: %w", id, err)
			}
			page = append(page, ch)
		}
		if err := a.file(ctx, c, page); err != nil {
			return n, err
		}
		n += len(ids)
		after = ids[len(ids)-1]
	}
}

// rememberPending records, once the run's findings are stored, the pending
// charges the run staged and, with forget, forgets the remembered ones it
// found final (staged as anything but pending) and whose row is settled,
// in one transaction. checked_at is the last time a charge was seen
// pending.
func (s *Store) rememberPending(ctx context.Context, runID int64, forget bool, now time.Time) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO {schema}.audit_pending (charge_id, created, first_run_id, last_run_id, checked_at)
			SELECT charge_id, to_timestamp(created), $1, $1, $2 FROM {schema}.audit_stage WHERE run_id = $1 AND grp = 4
			ON CONFLICT (charge_id) DO UPDATE SET last_run_id = excluded.last_run_id, checked_at = excluded.checked_at`, runID, now); err != nil {
			return err
		}
		if !forget {
			return tx.QueryRow(ctx, `SELECT count(*) FROM {schema}.audit_pending`).Scan(&n)
		}
		// A final debit whose row is still processing stays remembered
		// (unsettledFindings): forgetting it would leave nothing that
		// ever says the row was not settled.
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.audit_pending p USING {schema}.audit_stage s
			WHERE s.run_id = $1 AND s.grp <> 4 AND s.charge_id = p.charge_id
				AND NOT EXISTS (SELECT 1 FROM {schema}.billing_records r
					WHERE r.status = 'processing' AND r.charge_id IN (s.charge_id, s.payment_intent_id))`, runID); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM {schema}.audit_pending`).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("remembering the run's pending charges: %w", err)
	}
	return n, nil
}

// unsettledGrace is how long a remembered debit may have been final
// (since the last run that saw it pending) while its row is processing
// before unsettledFindings reports it: twice the consumer's longest gap
// between two polls of a processing row (6 h), so a follow-up loop that
// works always settles it first.
const unsettledGrace = 12 * time.Hour

// unsettledFindings reports the processing rows whose remembered debit this
// run found final at Stripe (succeeded or failed: staged as anything but
// pending), and last saw pending more than unsettledGrace ago, while the
// ledger still says processing (issue 25). Settling is
// the consumer's follow-up loop's work (polls, webhooks); with it off or
// its polls failing, a failed debit would otherwise be forgotten here and
// its customer stay unbilled in silence, and a succeeded one stay
// unrecorded. One stuck_pending finding per row (the finding kinds are
// fixed by the schema), with what Stripe says; the next run resolves it
// once the row is settled. period, when set, limits them to its rows.
func (a *Auditor) unsettledFindings(ctx context.Context, runID int64, period string) ([]Finding, error) {
	rows, err := a.store.pool.Query(ctx, `SELECT s.charge_id, coalesce(s.payment_intent_id, ''), s.grp
		FROM {schema}.audit_stage s JOIN {schema}.audit_pending p ON p.charge_id = s.charge_id
		WHERE s.run_id = $1 AND s.grp <> 4 AND p.checked_at < $2`, runID, a.cfg.Clock.Now().Add(-unsettledGrace))
	if err != nil {
		return nil, fmt.Errorf("reading the remembered debits this run found final: %w", err)
	}
	outcome := map[string]string{}
	var ids []string
	for rows.Next() {
		var id, intent string
		var grp int16
		if err := rows.Scan(&id, &intent, &grp); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the remembered debits this run found final: %w", err)
		}
		said := "succeeded"
		if grp == stageFailed {
			said = "failed"
		}
		for _, x := range []string{id, intent} {
			if x != "" {
				outcome[x] = said
				ids = append(ids, x)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the remembered debits this run found final: %w", err)
	}
	recs, err := a.ledger.ByChargeIDs(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("reading the rows of the remembered debits: %w", err)
	}
	var fs []Finding
	seen := map[string]bool{}
	for id, r := range recs {
		if r.Status != ledger.StatusProcessing || seen[r.IdempotencyKey] || (period != "" && r.BillingPeriod != period) {
			continue
		}
		seen[r.IdempotencyKey] = true
		said := outcome[id]
		why := "the customer is not billed: nothing charges the key again until the row is settled (declined)"
		if said == "succeeded" {
			why = "the customer paid, but the ledger does not record the charge until the row is settled (charged)"
		}
		fs = append(fs, Finding{Kind: KindStuckPending, Subject: r.IdempotencyKey, CustomerID: r.CustomerID,
			BillingPeriod: r.BillingPeriod, StripeCustomerID: r.StripeCustomerID, ChargeID: r.ChargeID,
			IdempotencyKey: r.IdempotencyKey, AmountCents: r.AmountCents, Currency: r.Currency,
			Detail: fmt.Sprintf("unsettled processing row: its debit %s %s at Stripe, but the ledger still says processing "+
				"(since %s): the consumer's follow-up loop (polls, webhooks) is off or failing; %s",
				r.ChargeID, said, r.UpdatedAt.UTC().Format(time.RFC3339), why)})
	}
	return fs, nil
}
