package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
)

// Kind is what a finding is about.
type Kind string

// The finding kinds of DESIGN.md "Auditor, per run".
const (
	// KindDuplicate: a second billable charge for one customer and period.
	KindDuplicate Kind = "duplicate_charge"
	// KindOrphan: a pelguard charge the ledger does not record as charged.
	KindOrphan Kind = "orphan_charge"
	// KindMissing: the ledger says charged, Stripe has no such succeeded
	// charge.
	KindMissing Kind = "missing_charge"
	// KindAmountMismatch: the ledger's charge differs in amount or currency.
	KindAmountMismatch Kind = "amount_mismatch"
	// KindStuckPending: a pending row nobody has worked on for a long time.
	KindStuckPending Kind = "stuck_pending"
	// KindDisputed: a customer disputed a pelguard charge (Stripe's
	// charge.disputed). Its money is in motion until the dispute closes;
	// the refund command never refunds a finding of this kind.
	KindDisputed Kind = "disputed"
	// KindAmbiguousLegacy: a legacy (unmarked) charge billed to a Stripe
	// customer that stands for several of the team's customers, which
	// nothing on the charge tells apart: it may be a second charge of one
	// customer or the only charge of another. Reported for a person to
	// decide, never refunded by pelguard.
	KindAmbiguousLegacy Kind = "ambiguous_legacy"
	// KindRefundedOnly: the ledger's repair after it lost commits found a
	// key whose only charges at Stripe are fully refunded. It is not
	// recorded as charged (the money is back with the customer) nor billed
	// again without a person: were the refunds meant? Subject: the key's
	// idempotency key. Never refunded by pelguard.
	KindRefundedOnly Kind = ledger.FindingRefundedOnly
)

// Kinds lists every kind, most urgent first.
var Kinds = []Kind{KindDuplicate, KindOrphan, KindMissing, KindAmountMismatch, KindDisputed,
	KindAmbiguousLegacy, KindRefundedOnly, KindStuckPending}

// State is where a finding stands.
type State string

// Finding states.
const (
	StateOpen      State = "open"
	StateRefunded  State = "refunded"
	StateResolved  State = "resolved"
	StateDismissed State = "dismissed"
)

// Finding is one row of audit_findings.
type Finding struct {
	ID    int64 `json:"id"`
	Kind  Kind  `json:"kind"`
	State State `json:"state"`
	// Subject is the charge id (duplicate, orphan, mismatch) or the
	// idempotency key (missing, stuck).
	Subject           string `json:"subject"`
	Legacy            bool   `json:"legacy,omitempty"`
	CustomerID        string `json:"customer_id,omitempty"`
	BillingPeriod     string `json:"billing_period,omitempty"`
	StripeCustomerID  string `json:"stripe_customer_id,omitempty"`
	ChargeID          string `json:"charge_id,omitempty"`
	CanonicalChargeID string `json:"canonical_charge_id,omitempty"`
	IdempotencyKey    string `json:"idempotency_key,omitempty"`
	AmountCents       int64  `json:"amount_cents,omitempty"`
	Currency          string `json:"currency,omitempty"`
	Detail            string `json:"detail,omitempty"`
	RefundID          string `json:"refund_id,omitempty"`
	RefundedCents     int64  `json:"refunded_cents,omitempty"`
	// ResolvedByRunID and Resolution are set when an audit run resolved
	// the finding by itself (its cause was gone); a finding resolved by
	// hand has neither.
	ResolvedByRunID int64  `json:"resolved_by_run_id,omitempty"`
	Resolution      string `json:"resolution,omitempty"`
	// RefundSkipReason is why the last refund run left it open
	// ("code: reason", see SkipCode).
	RefundSkipReason string    `json:"refund_skip_reason,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	// New is set in a run's report for findings that run inserted.
	New bool `json:"new,omitempty"`
}

// Store reads and changes findings; it needs Postgres only, so the
// findings, resolve and dismiss commands run without a Stripe key.
type Store struct{ pool pg.DB }

// NewStore returns a Store over pool, for the audit tables in schema
// (empty: pelguard's default schema).
func NewStore(pool *pgxpool.Pool, schema string) *Store {
	return &Store{pool: pg.NewDB(pool, schema)}
}

const findingCols = `id, kind, state, subject, legacy, coalesce(customer_id, ''), coalesce(billing_period, ''),
	coalesce(stripe_customer_id, ''), coalesce(charge_id, ''), coalesce(canonical_charge_id, ''),
	coalesce(idempotency_key, ''), coalesce(amount_cents, 0), coalesce(currency, ''), detail,
	coalesce(refund_id, ''), coalesce(refunded_cents, 0), coalesce(resolved_by_run_id, 0),
	coalesce(resolution, ''), coalesce(refund_skip_reason, ''), created_at`

func scanFinding(row pgx.Row) (Finding, error) {
	var f Finding
	var kind, state string
	err := row.Scan(&f.ID, &kind, &state, &f.Subject, &f.Legacy, &f.CustomerID, &f.BillingPeriod,
		&f.StripeCustomerID, &f.ChargeID, &f.CanonicalChargeID, &f.IdempotencyKey, &f.AmountCents,
		&f.Currency, &f.Detail, &f.RefundID, &f.RefundedCents, &f.ResolvedByRunID, &f.Resolution, &f.RefundSkipReason, &f.CreatedAt)
	f.Kind, f.State = Kind(kind), State(state)
	return f, err
}

// insertFindings stores fs and fills in each one's id, state and New flag
// from what the table now holds. A finding already known is not added
// again; if it is still open, what this run saw replaces its canonical
// charge, amount and detail (a canonical refunded elsewhere makes another
// charge the canonical one: a refund must be judged against that one). A
// resolved, dismissed or refunded finding is left exactly as it is: a rerun
// never reopens or rewrites it.
func (s *Store) insertFindings(ctx context.Context, runID int64, fs []Finding) error {
	const chunk = 1000
	for start := 0; start < len(fs); start += chunk {
		part := fs[start:min(start+chunk, len(fs))]
		n := len(part)
		kinds, subjects, cust, per, scust := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		charge, canon, key, cur, detail := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		legacy, amount := make([]bool, n), make([]int64, n)
		for i, f := range part {
			kinds[i], subjects[i], cust[i], per[i], scust[i] = string(f.Kind), f.Subject, f.CustomerID, f.BillingPeriod, f.StripeCustomerID
			charge[i], canon[i], key[i], cur[i], detail[i] = f.ChargeID, f.CanonicalChargeID, f.IdempotencyKey, f.Currency, f.Detail
			legacy[i], amount[i] = f.Legacy, f.AmountCents
		}
		// The outer SELECT sees the table as it was before the INSERT, so a
		// row is either returned by ins (new) or found in audit_findings
		// (already known), never both.
		rows, err := s.pool.Query(ctx, `
			WITH input AS (
				SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::text[], $5::text[], $6::text[],
					$7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[], $12::text[])
					AS t(kind, subject, legacy, customer_id, billing_period, stripe_customer_id,
						charge_id, canonical_charge_id, idempotency_key, amount_cents, currency, detail)
			), ins AS (
				INSERT INTO {schema}.audit_findings (kind, subject, legacy, customer_id, billing_period, stripe_customer_id,
					charge_id, canonical_charge_id, idempotency_key, amount_cents, currency, detail, first_run_id)
				SELECT kind, subject, legacy, nullif(customer_id, ''), nullif(billing_period, ''),
					nullif(stripe_customer_id, ''), nullif(charge_id, ''), nullif(canonical_charge_id, ''),
					nullif(idempotency_key, ''), amount_cents, nullif(currency, ''), detail, $13
				FROM input
				ON CONFLICT (kind, subject) DO UPDATE SET canonical_charge_id = excluded.canonical_charge_id,
					amount_cents = excluded.amount_cents, detail = excluded.detail, updated_at = now()
				WHERE audit_findings.state = 'open' AND (audit_findings.canonical_charge_id, audit_findings.amount_cents,
					audit_findings.detail) IS DISTINCT FROM (excluded.canonical_charge_id, excluded.amount_cents, excluded.detail)
				RETURNING id, kind, subject, state, xmax = 0 AS inserted
			)
			SELECT i.kind, i.subject, coalesce(ins.id, f.id), coalesce(ins.state, f.state), coalesce(ins.inserted, false)
			FROM input i
			LEFT JOIN ins ON ins.kind = i.kind AND ins.subject = i.subject
			LEFT JOIN {schema}.audit_findings f ON f.kind = i.kind AND f.subject = i.subject`,
			kinds, subjects, legacy, cust, per, scust, charge, canon, key, amount, cur, detail, runID)
		if err != nil {
			return fmt.Errorf("storing %d findings: %w", n, err)
		}
		type ks struct{ kind, subject string }
		got := make(map[ks]Finding, n)
		for rows.Next() {
			var k ks
			var f Finding
			var state string
			if err := rows.Scan(&k.kind, &k.subject, &f.ID, &state, &f.New); err != nil {
				rows.Close()
				return fmt.Errorf("reading stored findings: %w", err)
			}
			f.State = State(state)
			got[k] = f
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("storing %d findings: %w", n, err)
		}
		for i := range part {
			g := got[ks{string(part[i].Kind), part[i].Subject}]
			part[i].ID, part[i].State, part[i].New = g.ID, g.State, g.New
		}
	}
	return nil
}

// Filter selects findings; zero fields match everything.
type Filter struct {
	Kind   Kind
	State  State
	Period string
	// Limit caps the rows returned (newest first); 0 means 1000.
	Limit int
}

// Findings lists findings matching f, newest first.
func (s *Store) Findings(ctx context.Context, f Filter) ([]Finding, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.pool.Query(ctx, `SELECT `+findingCols+` FROM {schema}.audit_findings
		WHERE ($1 = '' OR kind = $1) AND ($2 = '' OR state = $2) AND ($3 = '' OR billing_period = $3)
		ORDER BY id DESC LIMIT $4`, string(f.Kind), string(f.State), f.Period, limit)
	if err != nil {
		return nil, fmt.Errorf("listing findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finding, error) { return scanFinding(r) })
	if err != nil {
		return nil, fmt.Errorf("listing findings: %w", err)
	}
	return out, nil
}

// Get reads one finding.
func (s *Store) Get(ctx context.Context, id int64) (Finding, error) {
	f, err := scanFinding(s.pool.QueryRow(ctx, `SELECT `+findingCols+` FROM {schema}.audit_findings WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Finding{}, fmt.Errorf("finding %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Finding{}, fmt.Errorf("reading finding %d: %w", id, err)
	}
	return f, nil
}

// Resolve marks a finding handled by hand (open or dismissed → resolved).
// A resolved finding stays resolved: reruns never reopen it.
func (s *Store) Resolve(ctx context.Context, id int64) (Finding, error) {
	return s.setState(ctx, id, StateResolved, StateOpen, StateDismissed)
}

// Dismiss marks an open finding as not a problem (open → dismissed).
func (s *Store) Dismiss(ctx context.Context, id int64) (Finding, error) {
	return s.setState(ctx, id, StateDismissed, StateOpen)
}

func (s *Store) setState(ctx context.Context, id int64, to State, from ...State) (Finding, error) {
	allowed := make([]string, len(from))
	for i, st := range from {
		allowed[i] = string(st)
	}
	f, err := scanFinding(s.pool.QueryRow(ctx, `UPDATE {schema}.audit_findings SET state = $2, updated_at = now()
		WHERE id = $1 AND state = ANY($3::text[]) RETURNING `+findingCols, id, string(to), allowed))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := s.Get(ctx, id)
		if gerr != nil {
			return Finding{}, gerr
		}
		return cur, fmt.Errorf("finding %d is %s, cannot become %s: %w", id, cur.State, to, ErrState)
	}
	if err != nil {
		return Finding{}, fmt.Errorf("setting finding %d to %s: %w", id, to, err)
	}
	return f, nil
}

// openFindings lists the open findings a run of period (empty: any) may
// re-check, oldest first.
func (s *Store) openFindings(ctx context.Context, period string) ([]Finding, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+findingCols+` FROM {schema}.audit_findings
		WHERE state = 'open' AND ($1 = '' OR billing_period = $1) ORDER BY id`, period)
	if err != nil {
		return nil, fmt.Errorf("listing open findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finding, error) { return scanFinding(r) })
	if err != nil {
		return nil, fmt.Errorf("listing open findings: %w", err)
	}
	return out, nil
}

// countOpen counts the findings open now, of period when set (empty: all),
// whichever run or import stored them: a run's exit status.
func (s *Store) countOpen(ctx context.Context, period string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM {schema}.audit_findings
		WHERE state = 'open' AND ($1 = '' OR billing_period = $1)`, period).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting open findings: %w", err)
	}
	return n, nil
}

// resolveByRun marks the open findings of rs resolved by run runID, each
// with its reason. A finding that stopped being open meanwhile (refunded,
// dismissed by an operator) is left as it is.
func (s *Store) resolveByRun(ctx context.Context, runID int64, rs []resolution) (int, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	ids, why := make([]int64, len(rs)), make([]string, len(rs))
	for i, r := range rs {
		ids[i], why[i] = r.id, r.reason
	}
	tag, err := s.pool.Exec(ctx, `UPDATE {schema}.audit_findings f SET state = 'resolved', resolved_by_run_id = $1,
		resolution = r.reason, updated_at = now()
		FROM unnest($2::bigint[], $3::text[]) AS r(id, reason)
		WHERE f.id = r.id AND f.state = 'open'`, runID, ids, why)
	if err != nil {
		return 0, fmt.Errorf("resolving %d findings: %w", len(rs), err)
	}
	return int(tag.RowsAffected()), nil
}

// openDuplicates lists open duplicate findings, oldest first.
func (s *Store) openDuplicates(ctx context.Context) ([]Finding, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+findingCols+` FROM {schema}.audit_findings
		WHERE kind = 'duplicate_charge' AND state = 'open' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing open duplicates: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finding, error) { return scanFinding(r) })
	if err != nil {
		return nil, fmt.Errorf("listing open duplicates: %w", err)
	}
	return out, nil
}

// openMissing reports whether chargeID has an open missing_charge finding:
// a canonical charge Stripe may not have must not justify a refund.
func (s *Store) openMissing(ctx context.Context, chargeID string) (bool, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM {schema}.audit_findings
		WHERE kind = 'missing_charge' AND state = 'open' AND charge_id = $1`, chargeID).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("checking missing findings for %s: %w", chargeID, err)
	}
	return n > 0, nil
}

// checkpoint is the end of the last successful scheduled window.
func (s *Store) checkpoint(ctx context.Context) (time.Time, bool, error) {
	var t *time.Time
	err := s.pool.QueryRow(ctx, `SELECT max(window_to) FROM {schema}.audit_runs WHERE status = 'ok' AND NOT manual`).Scan(&t)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("reading the audit checkpoint: %w", err)
	}
	if t == nil {
		return time.Time{}, false, nil
	}
	return *t, true, nil
}

func (s *Store) startRun(ctx context.Context, w Window, manual bool, now time.Time) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO {schema}.audit_runs (started_at, window_from, window_to, manual)
		VALUES ($1, $2, $3, $4) RETURNING id`, now, w.From, w.To, manual).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("recording the audit run: %w", err)
	}
	return id, nil
}

func (s *Store) finishRun(ctx context.Context, id int64, scanned int64, newFindings, resolved int, runErr error, now time.Time) error {
	status, msg := "ok", (*string)(nil)
	if runErr != nil {
		status = "failed"
		m := redact.String(runErr.Error())
		msg = &m
	}
	_, err := s.pool.Exec(ctx, `UPDATE {schema}.audit_runs SET finished_at = $2, status = $3, charges_scanned = $4,
		findings_new = $5, error = $6, findings_resolved = $7 WHERE id = $1`, id, now, status, scanned, newFindings, msg, resolved)
	if err != nil {
		return fmt.Errorf("recording the end of audit run %d: %w", id, err)
	}
	return nil
}
