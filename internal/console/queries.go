package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
)

// Every page query reads through an index (explain_test.go EXPLAINs each on
// a seeded ledger and fails on a sequential scan of billing_records or
// audit_findings); migration 00010 adds the ones the pages need.

// statusCount is one ledger status of a period. The status is the row's
// text: a state added later (processing, action_required) shows as it is.
type statusCount struct {
	Status   string
	Currency string
	N        int64
	Cents    int64
}

// qPeriods lists the latest billing periods without reading every row: a
// loose index scan over billing_records_period_status_idx.
const qPeriods = `WITH RECURSIVE p(period) AS (
		(SELECT billing_period FROM {schema}.billing_records ORDER BY billing_period DESC LIMIT 1)
		UNION ALL
		SELECT (SELECT b.billing_period FROM {schema}.billing_records b WHERE b.billing_period < p.period
			ORDER BY b.billing_period DESC LIMIT 1) FROM p WHERE p.period IS NOT NULL)
	SELECT period FROM p WHERE period IS NOT NULL LIMIT $1`

func periods(ctx context.Context, db pg.DB, n int) ([]string, error) {
	rows, err := db.Query(ctx, qPeriods, n)
	if err != nil {
		return nil, fmt.Errorf("listing billing periods: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

const qOutcomes = `SELECT status, currency, count(*), coalesce(sum(amount_cents), 0)::bigint FROM {schema}.billing_records
	WHERE billing_period = $1 GROUP BY status, currency ORDER BY count(*) DESC`

func outcomes(ctx context.Context, db pg.DB, period string) ([]statusCount, error) {
	rows, err := db.Query(ctx, qOutcomes, period)
	if err != nil {
		return nil, fmt.Errorf("counting the ledger of %s: %w", period, err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[statusCount])
}

type capRow struct {
	Period   string
	Cap      int64
	Reserved int64
}

// Pct is how much of the cap is reserved, in whole percent.
func (c capRow) Pct() int64 {
	if c.Cap <= 0 {
		return 100
	}
	return c.Reserved * 100 / c.Cap
}

const qCaps = `SELECT billing_period, cap_cents, reserved_cents FROM {schema}.spend_caps ORDER BY billing_period DESC LIMIT $1`

func caps(ctx context.Context, db pg.DB, n int) ([]capRow, error) {
	rows, err := db.Query(ctx, qCaps, n)
	if err != nil {
		return nil, fmt.Errorf("reading spend caps: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[capRow])
}

type runRow struct {
	ID        int64
	Started   time.Time
	Finished  *time.Time
	Status    string
	Scanned   int64
	New       int
	Resolved  int
	Error     string
	WindowTo  time.Time
	Manual    bool
	HaveOKRun bool
	LastOK    time.Time
}

const qLastRun = `SELECT r.id, r.started_at, r.finished_at, r.status, r.charges_scanned, r.findings_new, r.findings_resolved,
		coalesce(r.error, ''), r.window_to, r.manual,
		ok.finished_at IS NOT NULL, coalesce(ok.finished_at, 'epoch'::timestamptz)
	FROM (SELECT * FROM {schema}.audit_runs ORDER BY id DESC LIMIT 1) r
	LEFT JOIN LATERAL (SELECT finished_at FROM {schema}.audit_runs WHERE status = 'ok' ORDER BY id DESC LIMIT 1) ok ON true`

func lastRun(ctx context.Context, db pg.DB) (*runRow, error) {
	var r runRow
	err := db.QueryRow(ctx, qLastRun).Scan(&r.ID, &r.Started, &r.Finished, &r.Status, &r.Scanned, &r.New, &r.Resolved,
		&r.Error, &r.WindowTo, &r.Manual, &r.HaveOKRun, &r.LastOK)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the last audit run: %w", err)
	}
	return &r, nil
}

type kindCount struct {
	Kind     string
	Currency string
	N        int64
	Cents    int64
}

// qOpenByKind reads the open findings from audit_findings_open_kind_idx
// alone (it carries the amount).
const qOpenByKind = `SELECT kind, coalesce(currency, ''), count(*), coalesce(sum(amount_cents), 0)::bigint
	FROM {schema}.audit_findings WHERE state = 'open' GROUP BY kind, currency ORDER BY count(*) DESC`

func openByKind(ctx context.Context, db pg.DB) ([]kindCount, error) {
	rows, err := db.Query(ctx, qOpenByKind)
	if err != nil {
		return nil, fmt.Errorf("counting open findings: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[kindCount])
}

// findingFilter is the findings page's query string.
type findingFilter struct {
	Kind, State, Period, Customer string
	Before                        int64 // keyset: ids below this
}

// The findings page picks the index its filter can use: a customer's, a
// period's or a state's findings, else the newest overall, each newest
// first and paged by id (no OFFSET over 100,000 rows).
const findingCols = `id, kind, state, legacy, coalesce(customer_id, ''), coalesce(billing_period, ''),
	coalesce(stripe_customer_id, ''), coalesce(charge_id, ''), coalesce(canonical_charge_id, ''),
	coalesce(amount_cents, 0), coalesce(currency, ''), detail, coalesce(refund_id, ''),
	coalesce(resolution, ''), coalesce(refund_skip_reason, ''), created_at, updated_at`

const findingWhere = `($1 = '' OR kind = $1) AND ($2 = '' OR state = $2) AND ($3 = '' OR billing_period = $3)
	AND ($4 = '' OR customer_id = $4) AND ($5 = 0 OR id < $5)`

var (
	qFindingsByCustomer = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE customer_id = $4 AND ` + findingWhere +
		` ORDER BY id DESC LIMIT $6`
	qFindingsByPeriod = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE billing_period = $3 AND ` + findingWhere +
		` ORDER BY id DESC LIMIT $6`
	qFindingsByState = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE state = $2 AND ` + findingWhere +
		` ORDER BY id DESC LIMIT $6`
	qFindingsAll = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE ` + findingWhere + ` ORDER BY id DESC LIMIT $6`
)

// findingRow is a finding as the pages show it.
type findingRow struct {
	ID                                     int64
	Kind, State                            string
	Legacy                                 bool
	CustomerID, BillingPeriod, StripeCust  string
	ChargeID, CanonicalChargeID            string
	AmountCents                            int64
	Currency, Detail, RefundID, Resolution string
	SkipReason                             string
	Created, Updated                       time.Time
}

func (f findingQuery) sql() string {
	switch {
	case f.Customer != "":
		return qFindingsByCustomer
	case f.Period != "":
		return qFindingsByPeriod
	case f.State != "":
		return qFindingsByState
	}
	return qFindingsAll
}

type findingQuery struct {
	findingFilter
	Limit int
}

func (f findingQuery) args() []any {
	return []any{f.Kind, f.State, f.Period, f.Customer, f.Before, f.Limit}
}

func listFindings(ctx context.Context, db pg.DB, q findingQuery) ([]findingRow, error) {
	rows, err := db.Query(ctx, q.sql(), q.args()...)
	if err != nil {
		return nil, fmt.Errorf("listing findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[findingRow])
	if err != nil {
		return nil, fmt.Errorf("listing findings: %w", err)
	}
	return out, nil
}

const qFinding = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE id = $1`

func getFinding(ctx context.Context, db pg.DB, id int64) (findingRow, error) {
	rows, err := db.Query(ctx, qFinding, id)
	if err != nil {
		return findingRow{}, fmt.Errorf("reading finding %d: %w", id, err)
	}
	f, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[findingRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return f, audit.ErrNotFound
	}
	return f, err
}

// ledgerRow is one billing_records row, with the money-in-motion columns
// of migration 00008 (attempt: the attempt whose key the next Stripe call
// uses; next_attempt_at: a retry the ledger drives; next_poll_at: a
// processing debit's next look). Extra holds every column the console does
// not name (to_jsonb of the row), so a column a later migration adds shows
// without a change here; the status is the row's text for the same reason.
type ledgerRow struct {
	CustomerID, BillingPeriod, StripeCust string
	AmountCents                           int64
	Currency, IdempotencyKey, Status      string
	ChargeID, LeaseOwner                  string
	LeaseExpires                          *time.Time
	Epoch                                 int64
	Attempts                              int
	FirstAttempt                          time.Time
	LastError, StreamMessageID            string
	Reserved                              int64
	ChargedAt                             *time.Time
	Created, Updated                      time.Time
	Attempt                               int
	NextAttempt, NextPoll                 *time.Time
	PaymentIntent, FailureCode            string
	Extra                                 map[string]any
}

var ledgerNamed = []string{"customer_id", "billing_period", "stripe_customer_id", "amount_cents", "currency",
	"idempotency_key", "status", "charge_id", "lease_owner", "lease_expires_at", "epoch", "attempts",
	"first_attempt_at", "last_error", "stream_message_id", "cap_reserved_cents", "charged_at", "created_at", "updated_at",
	"attempt", "next_attempt_at", "next_poll_at", "payment_intent_id", "failure_code"}

const ledgerCols = `b.customer_id, b.billing_period, b.stripe_customer_id, b.amount_cents, b.currency, b.idempotency_key,
	b.status, coalesce(b.charge_id, ''), coalesce(b.lease_owner, ''), b.lease_expires_at, b.epoch, b.attempts,
	b.first_attempt_at, coalesce(b.last_error, ''), coalesce(b.stream_message_id, ''), b.cap_reserved_cents,
	b.charged_at, b.created_at, b.updated_at, b.attempt, b.next_attempt_at, b.next_poll_at,
	coalesce(b.payment_intent_id, ''), coalesce(b.failure_code, ''), to_jsonb(b) - $3::text[]`

const qLedgerRow = `SELECT ` + ledgerCols + ` FROM {schema}.billing_records b WHERE b.customer_id = $1 AND b.billing_period = $2`

func getLedgerRow(ctx context.Context, db pg.DB, customer, period string) (*ledgerRow, error) {
	rows, err := db.Query(ctx, qLedgerRow, customer, period, ledgerNamed)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger row of %s/%s: %w", customer, period, err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[ledgerRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ledger row of %s/%s: %w", customer, period, err)
	}
	return &r, nil
}

// periodRow is one of a customer's ledger rows, for the period list.
type periodRow struct {
	Period string
	Status string
	Amount int64
	Cur    string
}

// qCustomerPeriods pages a customer's periods, newest first, by the
// primary key; $2 is the keyset (periods before it; ” for the first page).
const qCustomerPeriods = `SELECT billing_period,
		CASE WHEN status = 'pending' AND parked_at IS NOT NULL THEN 'parked' ELSE status END, amount_cents, currency
	FROM {schema}.billing_records
	WHERE customer_id = $1 AND ($2 = '' OR billing_period < $2) ORDER BY customer_id, billing_period DESC LIMIT $3`

func customerPeriods(ctx context.Context, db pg.DB, customer, before string, n int) ([]periodRow, error) {
	rows, err := db.Query(ctx, qCustomerPeriods, customer, before, n)
	if err != nil {
		return nil, fmt.Errorf("listing the periods of %s: %w", customer, err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[periodRow])
}

// actionRow is one console_actions row.
type actionRow struct {
	ID       int64
	At       time.Time
	Actor    string
	Action   string
	Target   string
	Reason   string
	Remote   string
	Outcome  string
	Detail   string
	Finished *time.Time
}

const actionCols = `id, at, actor, action, target, reason, coalesce(remote_addr, ''), outcome, detail, finished_at`

const qActions = `SELECT ` + actionCols + ` FROM {schema}.console_actions WHERE ($1 = 0 OR id < $1) AND ($2 = '' OR target = $2)
	ORDER BY id DESC LIMIT $3`

func listActions(ctx context.Context, db pg.DB, before int64, target string, n int) ([]actionRow, error) {
	rows, err := db.Query(ctx, qActions, before, target, n)
	if err != nil {
		return nil, fmt.Errorf("listing console actions: %w", err)
	}
	return collectActions(rows)
}

// qActionsOn reads the console's actions on any of a page's targets (a
// customer's findings and dead letters), newest first.
const qActionsOn = `SELECT ` + actionCols + ` FROM {schema}.console_actions WHERE target = ANY($1) ORDER BY id DESC LIMIT $2`

func actionsOn(ctx context.Context, db pg.DB, targets []string, n int) ([]actionRow, error) {
	if len(targets) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, qActionsOn, targets, n)
	if err != nil {
		return nil, fmt.Errorf("listing console actions: %w", err)
	}
	return collectActions(rows)
}

func getAction(ctx context.Context, db pg.DB, id int64) (actionRow, error) {
	rows, err := db.Query(ctx, `SELECT `+actionCols+` FROM {schema}.console_actions WHERE id = $1`, id)
	if err != nil {
		return actionRow{}, fmt.Errorf("reading console action %d: %w", id, err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[actionRow])
	a.Reason, a.Detail = redact.String(a.Reason), redact.String(a.Detail)
	return a, err
}

// collectActions reads action rows, their reasons and details redacted
// (a row recorded before reasons were redacted is shown redacted too).
func collectActions(rows pgx.Rows) ([]actionRow, error) {
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[actionRow])
	for i := range out {
		out[i].Reason, out[i].Detail = redact.String(out[i].Reason), redact.String(out[i].Detail)
	}
	return out, err
}

// parkedRow is a pending row the ledger stopped retrying by itself
// (migration 00011): a person must look.
type parkedRow struct {
	CustomerID, Period string
	Attempt            int
	ParkedAt           time.Time
	Reason             string
}

// qParked reads the parked rows through their partial index.
const qParked = `SELECT customer_id, billing_period, attempt, parked_at, coalesce(parked_reason, '')
	FROM {schema}.billing_records WHERE parked_at IS NOT NULL AND status = 'pending' ORDER BY parked_at DESC LIMIT $1`

func parkedRows(ctx context.Context, db pg.DB, n int) ([]parkedRow, error) {
	rows, err := db.Query(ctx, qParked, n)
	if err != nil {
		return nil, fmt.Errorf("reading parked rows: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[parkedRow])
}

// rollbackRow is one ledger_rollbacks row (migration 00012): a ledger that
// went back in time, and its repair from Stripe.
type rollbackRow struct {
	ID                   int64
	DetectedAt           time.Time
	DetectedBy, Evidence string
	LostSince            time.Time
	EpochFloor           int64
	RowsFenced           int64
	RepairStarted        *time.Time
	Repaired             *time.Time
	RepairedBy           string
	RowsRebuilt          int
	RowsRepaired         int
	RefundsRebuilt       int
	Findings             int
	Report, LastError    string
}

const rollbackCols = `id, detected_at, detected_by, evidence, lost_since, epoch_floor, rows_fenced, repair_started_at,
	repaired_at, coalesce(repaired_by, ''), rows_rebuilt, rows_repaired, refunds_rebuilt, findings,
	coalesce(report, ''), coalesce(last_error, '')`

// qRollbacks pages the rollbacks newest first by the primary key; $1 is the
// keyset (ids below it; 0 for the first page).
const qRollbacks = `SELECT ` + rollbackCols + ` FROM {schema}.ledger_rollbacks WHERE ($1 = 0 OR id < $1)
	ORDER BY id DESC LIMIT $2`

func listRollbacks(ctx context.Context, db pg.DB, before int64, n int) ([]rollbackRow, error) {
	rows, err := db.Query(ctx, qRollbacks, before, n)
	if err != nil {
		return nil, fmt.Errorf("listing ledger rollbacks: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rollbackRow])
	if err != nil {
		return nil, fmt.Errorf("listing ledger rollbacks: %w", err)
	}
	return out, nil
}

// openRollback is what the banner of every page says about the oldest
// rollback not yet repaired.
type openRollback struct {
	ID            int64
	DetectedAt    time.Time
	DetectedBy    string
	RepairStarted *time.Time
	RepairedBy    string
	Failed        bool // the last repair attempt failed (it is retried)
	More          bool // another rollback is open too
}

// qOpenRollback runs on every page: it reads ledger_rollbacks_open_idx (the
// open rollbacks alone), whatever the table's history.
const qOpenRollback = `SELECT id, detected_at, detected_by, repair_started_at, coalesce(repaired_by, ''),
		last_error IS NOT NULL, count(*) OVER () > 1
	FROM {schema}.ledger_rollbacks WHERE repaired_at IS NULL ORDER BY id LIMIT 1`

// getOpenRollback is nil when the ledger is not under repair.
func getOpenRollback(ctx context.Context, db pg.DB) (*openRollback, error) {
	var o openRollback
	err := db.QueryRow(ctx, qOpenRollback).Scan(&o.ID, &o.DetectedAt, &o.DetectedBy, &o.RepairStarted, &o.RepairedBy, &o.Failed, &o.More)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the open ledger rollback: %w", err)
	}
	return &o, nil
}

// witnessRow is one ledger_witness row: a process that writes the ledger.
type witnessRow struct {
	Writer     string
	Seq        int64
	LastCommit time.Time
}

// qWitnesses reads the newest witness rows (one per writer process, pruned
// after a week idle: a small table).
const qWitnesses = `SELECT writer, seq, updated_at FROM {schema}.ledger_witness ORDER BY updated_at DESC, writer LIMIT $1`

func listWitnesses(ctx context.Context, db pg.DB, n int) ([]witnessRow, error) {
	rows, err := db.Query(ctx, qWitnesses, n)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger witnesses: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[witnessRow])
}

// fenceRow is ledger_fence's one row.
type fenceRow struct {
	LedgerID   string
	EpochFloor int64
	Updated    time.Time
}

const qFence = `SELECT ledger_id, epoch_floor, updated_at FROM {schema}.ledger_fence`

func getFence(ctx context.Context, db pg.DB) (*fenceRow, error) {
	var f fenceRow
	err := db.QueryRow(ctx, qFence).Scan(&f.LedgerID, &f.EpochFloor, &f.Updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ledger fence: %w", err)
	}
	return &f, nil
}
