package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/ledger"
)

// The run's working set lives in Postgres, not in the auditor (issue 18):
// each listed page of 100 charges is copied into audit_stage (UNLOGGED,
// COPY) under the run's id as soon as it is filed, and the findings are
// computed from there, one ledger key's group at a time, read back in key
// order. The auditor's memory is then a page, a batch of LookupBatch groups
// and the findings, whatever the window holds: a month-end window of
// 1,000,000 charges costs no more than one of 10,000. The legacy charges of
// --legacy runs are the exception (they stay in memory, see legacy.go).

// Stage groups (audit_stage.grp).
const (
	// stagePelguard: a pelguard charge, under its ledger key.
	stagePelguard int16 = 1
	// stageUnkeyed: a marked charge without customer/period metadata.
	stageUnkeyed int16 = 2
	// stageSeen: any other succeeded charge; it only proves that a ledger
	// row's charge exists (missing_charge), by charge or intent id.
	stageSeen int16 = 3
	// stagePending: a pending charge (a bank debit in motion), remembered
	// in audit_pending until it is final (pending.go). Not missing, not
	// judged yet.
	stagePending int16 = 4
	// stageFailed: a failed charge. Never a charge; staged so that a
	// remembered pending charge that failed is forgotten, and a ledger row
	// that claims it charged is missing_charge.
	stageFailed int16 = 5
)

var stageCols = []string{"run_id", "grp", "charge_id", "payment_intent_id", "customer_id", "billing_period",
	"stripe_customer_id", "idempotency_key", "created", "amount_cents", "refunded_cents", "currency", "disputed"}

// stageRow is one listed charge on its way to audit_stage.
type stageRow struct {
	grp      int16
	k        groupKey
	e        entry
	disputed bool
}

// stageRows copies one page's rows into the run's stage.
func (a *Auditor) stageRows(ctx context.Context, runID int64, rows []stageRow) error {
	if len(rows) == 0 {
		return nil
	}
	_, err := a.store.pool.CopyFrom(ctx, pgx.Identifier{"audit_stage"}, stageCols, pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		r := &rows[i]
		var intent *string
		if r.e.intent != "" {
			intent = &r.e.intent
		}
		return []any{runID, r.grp, r.e.id, intent, r.k.customer, r.k.period, r.e.stripeCustomer, r.e.idemKey,
			r.e.created, r.e.amount, r.e.refunded, r.e.currency, r.e.disputed}, nil
	}))
	if err != nil {
		return fmt.Errorf("staging %d listed charges: %w", len(rows), err)
	}
	return nil
}

// clearStage deletes the stage of every run but keep (0: all). A run holds
// the run lock while it stages, so under that lock another run's rows can
// only be those of a run that crashed.
func (s *Store) clearStage(ctx context.Context, runID int64, others bool) error {
	q := `DELETE FROM {schema}.audit_stage WHERE run_id = $1`
	if others {
		q = `DELETE FROM {schema}.audit_stage WHERE run_id <> $1`
	}
	if _, err := s.pool.Exec(ctx, q, runID); err != nil {
		return fmt.Errorf("clearing the audit stage: %w", err)
	}
	return nil
}

// analyzeStage gives the planner the stage's statistics before the joins
// (an UNLOGGED table just filled has none).
func (s *Store) analyzeStage(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `ANALYZE {schema}.audit_stage`); err != nil {
		return fmt.Errorf("analyzing the audit stage: %w", err)
	}
	return nil
}

// scanStage streams the run's staged charges of grp, in ledger-key order
// and, within a key, oldest first; fn gets each group whole.
func (s *Store) scanStage(ctx context.Context, runID int64, grp int16, fn func(groupKey, []entry) error) error {
	rows, err := s.pool.Query(ctx, `SELECT customer_id, billing_period, charge_id, coalesce(payment_intent_id, ''),
			stripe_customer_id, idempotency_key, created, amount_cents, refunded_cents, currency, disputed
		FROM {schema}.audit_stage WHERE run_id = $1 AND grp = $2
		ORDER BY customer_id, billing_period, created, charge_id`, runID, grp)
	if err != nil {
		return fmt.Errorf("reading the audit stage: %w", err)
	}
	defer rows.Close()
	var cur groupKey
	var es []entry
	for rows.Next() {
		var k groupKey
		var e entry
		if err := rows.Scan(&k.customer, &k.period, &e.id, &e.intent, &e.stripeCustomer, &e.idemKey, &e.created,
			&e.amount, &e.refunded, &e.currency, &e.disputed); err != nil {
			return fmt.Errorf("reading the audit stage: %w", err)
		}
		if len(es) > 0 && k != cur {
			if err := fn(cur, es); err != nil {
				return err
			}
			es = nil
		}
		cur = k
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the audit stage: %w", err)
	}
	if len(es) > 0 {
		return fn(cur, es)
	}
	return nil
}

// countCharged counts the ledger rows charged in [from, to) (of period,
// when set): the report's LedgerCharged.
func (s *Store) countCharged(ctx context.Context, from, to time.Time, period string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM {schema}.billing_records
		WHERE status = 'charged' AND charged_at >= $1 AND charged_at < $2 AND ($3 = '' OR billing_period = $3)`,
		from, to, period).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting the ledger's charged rows: %w", err)
	}
	return n, nil
}

// missingRows returns the missing_charge candidates: the ledger rows
// charged in [from, to) (of period, when set) whose charge the run did not
// stage as succeeded or pending, by charge id or PaymentIntent id (two
// anti-joins on the stage, so the window's rows never come to the
// auditor), and the charged rows, of any window, whose charge the run read
// again and found failed (a debit that was pending when its window was
// audited).
func (s *Store) missingRows(ctx context.Context, runID int64, from, to time.Time, period string) ([]ledger.Record, error) {
	rows, err := s.pool.Query(ctx, `SELECT r.idempotency_key, r.customer_id, r.billing_period,
			coalesce(r.stripe_customer_id, ''), r.charge_id, r.amount_cents, r.currency, r.charged_at, r.first_attempt_at
		FROM {schema}.billing_records r
		WHERE r.status = 'charged' AND r.charged_at >= $2 AND r.charged_at < $3 AND ($4 = '' OR r.billing_period = $4)
			AND NOT EXISTS (SELECT 1 FROM {schema}.audit_stage s
				WHERE s.run_id = $1 AND s.charge_id = r.charge_id AND s.grp IN (1, 2, 3, 4))
			AND NOT EXISTS (SELECT 1 FROM {schema}.audit_stage s
				WHERE s.run_id = $1 AND s.payment_intent_id = r.charge_id AND s.grp IN (1, 2, 3, 4))
		UNION
		SELECT r.idempotency_key, r.customer_id, r.billing_period,
			coalesce(r.stripe_customer_id, ''), r.charge_id, r.amount_cents, r.currency, r.charged_at, r.first_attempt_at
		FROM {schema}.audit_stage s JOIN {schema}.billing_records r ON r.charge_id IN (s.charge_id, s.payment_intent_id)
		WHERE s.run_id = $1 AND s.grp = 5 AND r.status = 'charged' AND ($4 = '' OR r.billing_period = $4)
			AND EXISTS (SELECT 1 FROM {schema}.audit_pending p WHERE p.charge_id = s.charge_id)
		ORDER BY 8`, runID, from, to, period)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's rows without a listed charge: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ledger.Record, error) {
		var r ledger.Record
		err := row.Scan(&r.IdempotencyKey, &r.CustomerID, &r.BillingPeriod, &r.StripeCustomerID, &r.ChargeID,
			&r.AmountCents, &r.Currency, &r.ChargedAt, &r.FirstAttemptAt)
		r.Status = ledger.StatusCharged
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the ledger's rows without a listed charge: %w", err)
	}
	return out, nil
}

// chargedAmong returns which of ids are the charge ids of ledger rows
// charged in [from, to) (of period, when set): the open missing findings
// this run's window decides.
func (s *Store) chargedAmong(ctx context.Context, ids []string, from, to time.Time, period string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT charge_id FROM {schema}.billing_records
		WHERE status = 'charged' AND charged_at >= $2 AND charged_at < $3 AND ($4 = '' OR billing_period = $4)
			AND charge_id = ANY($1::text[])`, ids, from, to, period)
	if err != nil {
		return nil, fmt.Errorf("reading the rows of open missing findings: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the rows of open missing findings: %w", err)
	}
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}

// stagedShares reads, for the legacy keys (Stripe customer, period), the
// ledger customers whose staged pelguard charges bill that Stripe customer
// in that period: how many pelguard groups share a legacy key, and which
// team customers the stream maps to a Stripe customer.
func (s *Store) stagedShares(ctx context.Context, runID int64, keys []groupKey, fn func(stripeCustomer, period, customer string)) error {
	sc, per := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		sc[i], per[i] = k.customer, k.period
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT s.stripe_customer_id, s.billing_period, s.customer_id
		FROM {schema}.audit_stage s
		JOIN unnest($2::text[], $3::text[]) AS k(stripe_customer_id, billing_period)
			ON s.stripe_customer_id = k.stripe_customer_id AND s.billing_period = k.billing_period
		WHERE s.run_id = $1 AND s.grp = 1
		ORDER BY 1, 2, 3`, runID, sc, per)
	if err != nil {
		return fmt.Errorf("reading the pelguard groups of %d legacy keys: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b, c string
		if err := rows.Scan(&a, &b, &c); err != nil {
			return fmt.Errorf("reading the pelguard groups of legacy keys: %w", err)
		}
		fn(a, b, c)
	}
	return rows.Err()
}
