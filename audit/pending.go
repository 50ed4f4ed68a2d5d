package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
// found final (staged as anything but pending), in one transaction.
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
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.audit_pending p USING {schema}.audit_stage s
			WHERE s.run_id = $1 AND s.grp <> 4 AND s.charge_id = p.charge_id`, runID); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM {schema}.audit_pending`).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("remembering the run's pending charges: %w", err)
	}
	return n, nil
}
