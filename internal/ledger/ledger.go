// Package ledger is the only code that reads or writes billing_records and
// spend_caps. Postgres is pelguard's source of truth: Redis may lose or
// repeat deliveries (XAUTOCLAIM, partial batches, AOF rollback), and every
// such delivery comes through Reserve, which decides from the ledger whether
// a Stripe call may be made.
//
// Every write after Reserve is fenced by the row's epoch: a consumer that
// lost its lease can never overwrite the holder that took over.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/pg"
)

// Status is a billing record's state.
type Status string

// The states of DESIGN.md's state machine.
const (
	StatusPending  Status = "pending"
	StatusCharged  Status = "charged"
	StatusDeclined Status = "declined"
	StatusFailed   Status = "failed"
	// StatusProcessing: money in motion. The attempt's PaymentIntent ended
	// "processing" with a pending charge (a bank debit): not charged, not
	// chargeable again, not missing. Polled (NextPollAt) and settled by
	// webhooks until Stripe says it is final.
	StatusProcessing Status = "processing"
	// StatusActionRequired: Stripe needs the customer (authentication, a
	// payment method). Nothing was charged; a replay of the dead letter
	// charges again under the next attempt's key once it is fixed.
	StatusActionRequired Status = "action_required"
)

// Terminal reports whether a delivery of the event may not call Stripe for
// the row: every state but pending. Declined, failed and action_required
// rows are charged again only by the ledger (a due NextAttemptAt) or by a
// replay of their dead letter (Reopenable), each under a new attempt's key.
func (s Status) Terminal() bool { return s != StatusPending }

// Reopenable reports whether a replay of the row's dead letter charges
// again: the runbook's "fix, then replay" (a permanent Stripe error fixed at
// Stripe, a customer who authenticated or added a payment method).
func (s Status) Reopenable() bool { return s == StatusFailed || s == StatusActionRequired }

// Key identifies a billing record: one charge per customer per period.
type Key struct {
	CustomerID    string
	BillingPeriod string
}

func (k Key) String() string { return k.CustomerID + "/" + k.BillingPeriod }

// Record is one row of billing_records.
type Record struct {
	Key
	StripeCustomerID string
	AmountCents      int64
	Currency         string
	IdempotencyKey   string
	Status           Status
	ChargeID         string
	LeaseOwner       string
	LeaseExpiresAt   time.Time // zero when no lease is held
	Epoch            int64
	Attempts         int
	FirstAttemptAt   time.Time
	LastError        string
	StreamMessageID  string
	CapReservedCents int64
	ChargedAt        time.Time
	CreatedAt        time.Time
	UpdatedAt        time.Time

	// Attempt is the attempt whose idempotency key the next Stripe call
	// uses (AttemptKey): 1 until a final failure is recorded. Not Attempts,
	// the takeover counter.
	Attempt int
	// AttemptStartedAt and AttemptEpoch are when and at which epoch the
	// current attempt began: the safe key window is measured per attempt.
	AttemptStartedAt time.Time
	AttemptEpoch     int64
	// NextAttemptAt: a retry the ledger drives (soft decline, retryable
	// failed debit); zero when none is scheduled.
	NextAttemptAt time.Time
	// NextPollAt: when a processing row's charge is next read at Stripe.
	NextPollAt time.Time
	// PaymentIntentID is the latest attempt's intent (payment_intents mode).
	PaymentIntentID string
	// FailureCode is Stripe's decline or failure code of the latest attempt.
	FailureCode string
	// Redrives counts the ledger retry loop's takeovers of this attempt
	// (TakeDue after a release); reset when an attempt begins.
	Redrives int
	// ParkedAt and ParkedReason: the ledger stopped retrying this pending
	// row by itself (Park); a person takes it up with `consumer retry`.
	ParkedAt     time.Time
	ParkedReason string
	// Debit: the last final failure was a bank debit's (Settle), whose
	// re-presentments are limited (RetryRefusal).
	Debit bool
	// RetryOverride is the reason a person gave for retrying past the
	// debit rules (`consumer retry --override`), with who and when.
	RetryOverride string
}

// Parked reports whether the ledger stopped retrying the row by itself.
func (r Record) Parked() bool { return r.Status == StatusPending && !r.ParkedAt.IsZero() }

// TakenOverInAttempt reports whether the current attempt's key may have
// been sent to Stripe before this holder got the row (a takeover, not the
// attempt's first holder).
func (r Record) TakenOverInAttempt() bool { return r.Epoch > r.AttemptEpoch }

// LeaseLive reports whether someone holds an unexpired lease at now.
func (r Record) LeaseLive(now time.Time) bool {
	return r.Status == StatusPending && r.LeaseOwner != "" && r.LeaseExpiresAt.After(now)
}

// Errors callers branch on.
var (
	// ErrLeaseLost: the row's epoch or status moved on; the caller must not
	// write, and should re-read the row to learn what happened.
	ErrLeaseLost = errors.New("ledger lease lost")
	// ErrChargeRefunded: the charge a write would record as a key's charge
	// is one pelguard refunded as a duplicate (refund_ledger). Recording it
	// would make the ledger's canonical charge a refunded one; the row stays
	// pending and the next delivery looks again.
	ErrChargeRefunded = errors.New("ledger: the charge was refunded by pelguard")
	// ErrNoCap: RequireCap is set and the period has no spend cap.
	ErrNoCap = errors.New("no spend cap for the billing period")
	// ErrSpendCap matches every *CapError.
	ErrSpendCap = errors.New("spend cap exceeded")
	// ErrNotFound: no such row.
	ErrNotFound = errors.New("no billing record")
)

// CapError says a reservation would pass the period's spend cap.
type CapError struct {
	Period         string
	CapCents       int64
	ReservedCents  int64
	RequestedCents int64
}

func (e *CapError) Error() string {
	return fmt.Sprintf("spend cap for %s exceeded: cap %d, reserved %d, requested %d cents",
		e.Period, e.CapCents, e.ReservedCents, e.RequestedCents)
}

// Is makes errors.Is(err, ErrSpendCap) true.
func (e *CapError) Is(target error) bool { return target == ErrSpendCap }

// Ledger reads and writes billing records.
type Ledger struct {
	pool     pg.DB
	clock    clock.Clock
	imported importedCache
	witness  Witness
}

// New returns a Ledger over pool whose tables live in schema (empty:
// pg.DefaultSchema); every statement names that schema. A nil clock means
// the wall clock; leases and the safe key window are measured on it.
func New(pool *pgxpool.Pool, schema string, clk clock.Clock) *Ledger {
	return &Ledger{pool: pg.NewDB(pool, schema), clock: clock.Or(clk)}
}

// Schema is the schema that holds the ledger's tables.
func (l *Ledger) Schema() string { return l.pool.Schema() }

// DB is the schema-qualifying pool, for packages that keep tables beside
// the ledger's (the audit tables).
func (l *Ledger) DB() pg.DB { return l.pool }

// Now is the ledger's clock.
func (l *Ledger) Now() time.Time { return l.clock.Now() }

// Pool exposes the pool for health checks.
func (l *Ledger) Pool() *pgxpool.Pool { return l.pool.Pool }

const recordCols = `customer_id, billing_period, stripe_customer_id, amount_cents, currency,
	idempotency_key, status, coalesce(charge_id, ''), coalesce(lease_owner, ''), lease_expires_at,
	epoch, attempts, first_attempt_at, coalesce(last_error, ''), coalesce(stream_message_id, ''),
	cap_reserved_cents, charged_at, created_at, updated_at,
	attempt, coalesce(attempt_started_at, first_attempt_at), attempt_epoch, next_attempt_at, next_poll_at,
	coalesce(payment_intent_id, ''), coalesce(failure_code, ''),
	redrives, parked_at, coalesce(parked_reason, ''), debit, coalesce(retry_override, '')`

func scanRecord(row pgx.Row) (Record, error) {
	var r Record
	var status string
	var leaseExp, chargedAt, nextAttempt, nextPoll, parked *time.Time
	err := row.Scan(&r.CustomerID, &r.BillingPeriod, &r.StripeCustomerID, &r.AmountCents, &r.Currency,
		&r.IdempotencyKey, &status, &r.ChargeID, &r.LeaseOwner, &leaseExp,
		&r.Epoch, &r.Attempts, &r.FirstAttemptAt, &r.LastError, &r.StreamMessageID,
		&r.CapReservedCents, &chargedAt, &r.CreatedAt, &r.UpdatedAt,
		&r.Attempt, &r.AttemptStartedAt, &r.AttemptEpoch, &nextAttempt, &nextPoll,
		&r.PaymentIntentID, &r.FailureCode,
		&r.Redrives, &parked, &r.ParkedReason, &r.Debit, &r.RetryOverride)
	if err != nil {
		return Record{}, err
	}
	r.Status = Status(status)
	r.LeaseExpiresAt = deref(leaseExp)
	r.ChargedAt = deref(chargedAt)
	r.NextAttemptAt = deref(nextAttempt)
	r.NextPollAt = deref(nextPoll)
	r.ParkedAt = deref(parked)
	return r, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// Get reads one record.
func (l *Ledger) Get(ctx context.Context, k Key) (Record, error) {
	r, err := scanRecord(l.pool.QueryRow(ctx,
		`SELECT `+recordCols+` FROM {schema}.billing_records WHERE customer_id = $1 AND billing_period = $2`,
		k.CustomerID, k.BillingPeriod))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%s: %w", k, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("reading billing record %s: %w", k, err)
	}
	return r, nil
}

// Lookup reads many records in one query (the reaper's page). Keys without a
// row are absent from the map.
func (l *Ledger) Lookup(ctx context.Context, keys []Key) (map[Key]Record, error) {
	out := make(map[Key]Record, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cust := make([]string, len(keys))
	per := make([]string, len(keys))
	for i, k := range keys {
		cust[i], per[i] = k.CustomerID, k.BillingPeriod
	}
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE (customer_id, billing_period) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, cust, per)
	if err != nil {
		return nil, fmt.Errorf("looking up %d billing records: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning billing record: %w", err)
		}
		out[r.Key] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking up %d billing records: %w", len(keys), err)
	}
	return out, nil
}

// EventKey is the ledger key of an event.
func EventKey(ev event.Event) Key {
	return Key{CustomerID: ev.CustomerID, BillingPeriod: ev.BillingPeriod}
}
