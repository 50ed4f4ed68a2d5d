package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ledger's repair from Stripe (DESIGN.md "The ledger's own losses"): a
// ledger that lost commits (a failover to an asynchronous replica, a
// restore) has lost rows, or has rows taken back to pending or processing,
// whose charge Stripe has. Rebuild records such a charge under the same
// locks and fences as any ledger write: the key's and its Stripe customer's
// shared locks (a refund deciding about the key waits, and is waited for),
// the row's lock, and a new epoch past the fence's floor for every row it
// changes, so a holder from before the failover can never write it again.
// Every write is idempotent: a second repair, or two at once, change
// nothing more.

// RebuiltCharge is a key's charge as Stripe has it, for Rebuild.
type RebuiltCharge struct {
	Key
	StripeCustomerID string
	AmountCents      int64
	Currency         string
	// IdempotencyKey is the row's key (attempt 1's, the charge's
	// idempotency_key metadata), whatever attempt made the charge.
	IdempotencyKey string
	// Attempt is the attempt whose key made the charge (its attempt
	// metadata, 1 when absent); 0 when unknown (a charge without
	// pelguard's metadata): the row's attempt stays.
	Attempt         int
	ChargeID        string
	PaymentIntentID string
	// Pending: Stripe's charge is still pending (a bank debit in motion).
	// The row becomes processing and is polled until Stripe says it is
	// final; it is never charged again.
	Pending bool
	Created time.Time
	// Replaces is the charge a processing row may name that the caller
	// found over at Stripe (a debit that failed, whose failure the
	// failover erased): the row records this charge instead. Empty: a
	// processing row naming another charge is left as it is.
	Replaces string
}

func (c RebuiltCharge) validate() error {
	var missing []string
	for _, f := range []struct{ name, v string }{{"customer", c.CustomerID}, {"period", c.BillingPeriod},
		{"Stripe customer", c.StripeCustomerID}, {"currency", c.Currency}, {"idempotency key", c.IdempotencyKey},
		{"charge id", c.ChargeID}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	switch {
	case len(missing) > 0:
		return fmt.Errorf("ledger: rebuilding %s: missing %s", c.Key, strings.Join(missing, ", "))
	case c.AmountCents <= 0 || c.Attempt < 0 || c.Created.IsZero():
		return fmt.Errorf("ledger: rebuilding %s: amount %d, attempt %d, created %v: want a positive amount, an attempt >= 0 and the charge's time",
			c.Key, c.AmountCents, c.Attempt, c.Created)
	}
	return nil
}

// RebuildOutcome is what Rebuild did with one key.
type RebuildOutcome string

// Rebuild's outcomes.
const (
	// RebuildInserted: the key had no row; it now records the charge.
	RebuildInserted RebuildOutcome = "inserted"
	// RebuildRepaired: a pending, processing, declined, failed or
	// action_required row now records the charge, under a new epoch.
	RebuildRepaired RebuildOutcome = "repaired"
	// RebuildUnchanged: the row already records the charge as it is.
	RebuildUnchanged RebuildOutcome = "unchanged"
	// RebuildConflict: the row records another charge, bills another
	// Stripe customer, amount, currency or key, or its last final failure
	// is of a later attempt than the charge's; or another row records the
	// charge. Nothing was written: Detail says what a person must look at.
	RebuildConflict RebuildOutcome = "conflict"
	// RebuildRefunded: pelguard refunded the charge as a duplicate
	// (refund_ledger): it is never a key's charge (ErrChargeRefunded).
	RebuildRefunded RebuildOutcome = "refunded"
)

// RebuildResult is Rebuild's answer.
type RebuildResult struct {
	Outcome RebuildOutcome
	// Before is the row before the write, Record the row as it now stands
	// (each zero when there was, or is, none).
	Before Record
	Record Record
	// OverCap: the key's period has a spend cap that its reservations
	// already reach: the charge was recorded all the same (the money was
	// taken), its reservation clipped to the cap (see RecountCaps).
	OverCap bool
	Detail  string
}

// Rebuild records c as its key's charge, in one transaction: a missing row
// is inserted (charged, or processing for a pending charge, polled at
// once), reserving its amount in the period's spend cap; a pending or
// processing row is brought in line with a new epoch (any holder's Finish
// then fails with ErrLeaseLost), its lease cleared, its reservation kept; a
// declined, failed or action_required row whose last attempt is not later
// than the charge's is charged too (its reservation taken again). A row
// already charged is never given another charge (RebuildConflict), and a
// charge pelguard refunded as a duplicate is never recorded
// (RebuildRefunded).
func (l *Ledger) Rebuild(ctx context.Context, c RebuiltCharge) (RebuildResult, error) {
	if err := c.validate(); err != nil {
		return RebuildResult{}, err
	}
	c.Currency = strings.ToLower(c.Currency)
	var res RebuildResult
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		res = RebuildResult{}
		if err := l.lockKeysShared(ctx, tx, c.Key, StripeLockKey(c.StripeCustomerID, c.BillingPeriod)); err != nil {
			return err
		}
		var refunded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.refund_ledger WHERE charge_id = $1)`,
			c.ChargeID).Scan(&refunded); err != nil {
			return fmt.Errorf("rebuilding %s: %w", c.Key, err)
		}
		if refunded {
			res.Outcome, res.Detail = RebuildRefunded, fmt.Sprintf("charge %s was refunded by pelguard as a duplicate: never the key's charge", c.ChargeID)
			return nil
		}
		cur, err := l.lockRow(ctx, tx, c.Key)
		if errors.Is(err, ErrNotFound) {
			var done bool
			if done, err = l.insertRebuilt(ctx, tx, c, &res); err != nil || done {
				return err
			}
			// Someone inserted the key meanwhile (a consumer, another
			// repair): decide against their row.
			cur, err = l.lockRow(ctx, tx, c.Key)
		}
		if err != nil {
			return err
		}
		res.Before, res.Record = cur, cur
		return l.repairRow(ctx, tx, c, cur, &res)
	})
	if err != nil {
		return RebuildResult{}, fmt.Errorf("rebuilding %s from charge %s: %w", c.Key, c.ChargeID, err)
	}
	return res, nil
}

func (l *Ledger) lockRow(ctx context.Context, tx pgx.Tx, k Key) (Record, error) {
	r, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE customer_id = $1 AND billing_period = $2 FOR UPDATE`, k.CustomerID, k.BillingPeriod))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%s: %w", k, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("locking %s: %w", k, err)
	}
	return r, nil
}

// insertRebuilt inserts c's row. done is false when the key was inserted
// by someone else meanwhile; a charge or idempotency key another row holds
// is a conflict.
func (l *Ledger) insertRebuilt(ctx context.Context, tx pgx.Tx, c RebuiltCharge, res *RebuildResult) (done bool, err error) {
	now := l.clock.Now()
	status, chargedAt, poll := StatusCharged, &c.Created, (*time.Time)(nil)
	if c.Pending {
		status, chargedAt, poll = StatusProcessing, nil, &now
	}
	rec, err := scanRecord(tx.QueryRow(ctx, `
		INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents,
			currency, idempotency_key, status, charge_id, charged_at, epoch, attempts, first_attempt_at,
			attempt, attempt_started_at, attempt_epoch, payment_intent_id, next_poll_at, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, `+firstEpoch+`, 1, $10,
			$11, $10, `+firstEpoch+`, nullif($12, ''), $13, $14, $14)
		ON CONFLICT DO NOTHING
		RETURNING `+recordCols,
		c.CustomerID, c.BillingPeriod, c.StripeCustomerID, c.AmountCents, c.Currency, c.IdempotencyKey,
		string(status), c.ChargeID, chargedAt, c.Created, max(c.Attempt, 1), c.PaymentIntentID, poll, now))
	switch {
	case err == nil:
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("inserting: %w", err)
	default:
		var owner Key
		err := tx.QueryRow(ctx, `SELECT customer_id, billing_period FROM {schema}.billing_records
			WHERE (customer_id = $1 AND billing_period = $2) OR charge_id = $3 OR idempotency_key = $4
			ORDER BY (customer_id = $1 AND billing_period = $2) DESC LIMIT 1`,
			c.CustomerID, c.BillingPeriod, c.ChargeID, c.IdempotencyKey).Scan(&owner.CustomerID, &owner.BillingPeriod)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("reading the row that blocks the insert: %w", err)
		}
		if owner == c.Key || errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		res.Outcome = RebuildConflict
		res.Detail = fmt.Sprintf("the ledger records charge %s or key %s under %s: not inserted", c.ChargeID, c.IdempotencyKey, owner)
		return true, nil
	}
	reserved, over, err := reserveRebuilt(ctx, tx, c.BillingPeriod, c.AmountCents, now)
	if err != nil {
		return false, err
	}
	if reserved > 0 {
		if _, err := tx.Exec(ctx, `UPDATE {schema}.billing_records SET cap_reserved_cents = $3
			WHERE customer_id = $1 AND billing_period = $2`, c.CustomerID, c.BillingPeriod, reserved); err != nil {
			return false, fmt.Errorf("recording the cap reservation: %w", err)
		}
		rec.CapReservedCents = reserved
	}
	res.Outcome, res.Record, res.OverCap = RebuildInserted, rec, over
	return true, nil
}

// repairRow decides about the key's existing row, locked by the caller.
func (l *Ledger) repairRow(ctx context.Context, tx pgx.Tx, c RebuiltCharge, cur Record, res *RebuildResult) error {
	conflict := func(format string, args ...any) error {
		res.Outcome, res.Detail = RebuildConflict, fmt.Sprintf(format, args...)
		return nil
	}
	switch {
	case cur.StripeCustomerID != c.StripeCustomerID || cur.AmountCents != c.AmountCents ||
		cur.Currency != c.Currency || cur.IdempotencyKey != c.IdempotencyKey:
		return conflict("the row bills %s %d %s under key %s; the charge %s is %s %d %s under key %s: left as it is",
			cur.StripeCustomerID, cur.AmountCents, cur.Currency, cur.IdempotencyKey,
			c.ChargeID, c.StripeCustomerID, c.AmountCents, c.Currency, c.IdempotencyKey)
	case cur.ChargeID == c.ChargeID && (cur.Status == StatusCharged || cur.Status == StatusProcessing && c.Pending):
		res.Outcome = RebuildUnchanged
		return nil
	case cur.Status == StatusCharged:
		return conflict("the row is charged with %s, Stripe also has %s: left as it is (the auditor judges the second charge)",
			cur.ChargeID, c.ChargeID)
	case cur.Status == StatusProcessing && cur.ChargeID != c.ChargeID && cur.ChargeID != c.Replaces:
		return conflict("the row is processing debit %s, Stripe also has %s: left to the debit's settlement", cur.ChargeID, c.ChargeID)
	case cur.Status != StatusPending && cur.Status != StatusProcessing && (c.Attempt == 0 || c.Attempt < cur.Attempt):
		return conflict("the row is %s and waits for attempt %d; charge %s is attempt %d's: left as it is",
			cur.Status, cur.Attempt, c.ChargeID, c.Attempt)
	}
	now := l.clock.Now()
	reserved, over := cur.CapReservedCents, false
	if cur.Status != StatusPending && cur.Status != StatusProcessing {
		// A final failure released the reservation; the charge holds it again.
		var err error
		if reserved, over, err = reserveRebuilt(ctx, tx, c.BillingPeriod, c.AmountCents, now); err != nil {
			return err
		}
	}
	status, chargedAt, poll := StatusCharged, &c.Created, (*time.Time)(nil)
	if c.Pending {
		status, chargedAt, poll = StatusProcessing, nil, &now
	}
	r, err := scanRecord(tx.QueryRow(ctx, `
		UPDATE {schema}.billing_records SET status = $5, charge_id = $6, charged_at = $7, next_poll_at = $8,
			payment_intent_id = coalesce(nullif($9, ''), payment_intent_id),
			epoch = `+nextEpoch+`, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL,
			next_attempt_at = NULL, parked_at = NULL, parked_reason = NULL,
			attempt_epoch = CASE WHEN $10 > attempt THEN `+nextEpoch+` ELSE attempt_epoch END,
			attempt_started_at = CASE WHEN $10 > attempt THEN $11 ELSE attempt_started_at END,
			attempt = greatest(attempt, $10), cap_reserved_cents = $12, updated_at = $13
		WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = $4
		RETURNING `+recordCols,
		c.CustomerID, c.BillingPeriod, cur.Epoch, string(cur.Status), string(status), c.ChargeID, chargedAt, poll,
		c.PaymentIntentID, c.Attempt, c.Created, reserved, now))
	if err != nil {
		// The row is locked: only a bug can make the fence miss here.
		return fmt.Errorf("repairing the %s row: %w", cur.Status, err)
	}
	res.Outcome, res.Record, res.OverCap = RebuildRepaired, r, over
	return nil
}

// reserveRebuilt reserves amount in period's spend cap for a charge Stripe
// already made: never refused. It returns what the row reserves (its
// amount, or 0 when the period has no cap) and whether the cap was already
// reached; the cap's reservation is clipped to the cap (its CHECK), and
// RecountCaps makes it what the rows reserve.
func reserveRebuilt(ctx context.Context, tx pgx.Tx, period string, amount int64, now time.Time) (int64, bool, error) {
	var capCents, reserved int64
	err := tx.QueryRow(ctx, `SELECT cap_cents, reserved_cents FROM {schema}.spend_caps WHERE billing_period = $1 FOR UPDATE`,
		period).Scan(&capCents, &reserved)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading spend cap for %s: %w", period, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = least(cap_cents, reserved_cents + $2),
		updated_at = $3 WHERE billing_period = $1`, period, amount, now); err != nil {
		return 0, false, fmt.Errorf("reserving spend cap for %s: %w", period, err)
	}
	return amount, reserved+amount > capCents, nil
}

// UnsettledRows reads every pending and processing row: the rows a
// failover may have taken back from charged, which a repair looks up at
// Stripe when their charges carry no key.
func (l *Ledger) UnsettledRows(ctx context.Context) ([]Record, error) {
	var out []Record
	err := l.scan(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE status IN ('pending', 'processing') ORDER BY customer_id, billing_period`,
		func(r Record) error { out = append(out, r); return nil })
	if err != nil {
		return nil, fmt.Errorf("reading pending and processing rows: %w", err)
	}
	return out, nil
}

// RefundedCharges reports which of ids pelguard refunded (refund_ledger).
func (l *Ledger) RefundedCharges(ctx context.Context, ids []string) (map[string]bool, error) {
	out := make(map[string]bool)
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := l.pool.Query(ctx, `SELECT charge_id FROM {schema}.refund_ledger WHERE charge_id = ANY($1::text[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading refund_ledger: %w", err)
	}
	ch, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading refund_ledger: %w", err)
	}
	for _, id := range ch {
		out[id] = true
	}
	return out, nil
}
