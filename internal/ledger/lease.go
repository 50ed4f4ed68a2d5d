package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/event"
)

// Decision is what Reserve found.
type Decision int

const (
	// Acquired: a new pending row was inserted; the caller holds its lease
	// (epoch 1) and may call Stripe.
	Acquired Decision = iota + 1
	// TakenOver: the row was pending with an expired or released lease; the
	// caller now holds it with a new epoch and may call Stripe, with the same
	// idempotency key (and, past the safe window, after a Stripe lookup).
	TakenOver
	// AlreadyTerminal: the row is charged, declined or failed: ack, no call.
	AlreadyTerminal
	// Busy: someone else holds a live lease: leave the entry alone.
	Busy
	// Conflict: a row for the same customer and period records a different
	// Stripe customer, amount or currency. The event is not a redelivery of
	// what was billed, and charging it would break "one charge per customer
	// per period": it goes to the dead-letter stream for a human.
	Conflict
	// Reopened: a replayed dead letter (or a due ledger retry) of a row
	// whose last attempt failed finally at Stripe: the caller holds a new
	// epoch of a pending row, the spend cap re-reserved, and charges under
	// the row's Attempt key after cancelling the last attempt's intent.
	Reopened
)

func (d Decision) String() string {
	switch d {
	case Acquired:
		return "acquired"
	case TakenOver:
		return "taken_over"
	case AlreadyTerminal:
		return "already_terminal"
	case Busy:
		return "busy"
	case Conflict:
		return "conflict"
	case Reopened:
		return "reopened"
	}
	return fmt.Sprintf("decision(%d)", int(d))
}

// MayCharge reports whether the caller now holds the lease.
func (d Decision) MayCharge() bool { return d == Acquired || d == TakenOver || d == Reopened }

// Claim is Reserve's answer: the decision and the row as it now stands.
type Claim struct {
	Decision Decision
	Record   Record
}

// ReserveRequest asks for the lease on an event's row.
type ReserveRequest struct {
	Event          event.Event
	IdempotencyKey string
	Owner          string        // consumer name; recorded for operators
	Lease          time.Duration // how long the lease lasts without a heartbeat
	MessageID      string        // stream entry id, for operators only
	RequireCap     bool          // refuse periods without a spend cap
	// Replay: the delivery is a replayed dead letter (the runbook's "fix,
	// then replay"): a Reopenable row is charged again under its next
	// attempt's key instead of being acked as done.
	Replay bool
}

// Reserve is step 2 of DESIGN.md "Consumer, per event", in one transaction:
// insert the pending row with a lease and reserve the spend cap, or lock the
// existing row and decide. It returns a *CapError or ErrNoCap (and writes
// nothing) when the spend cap forbids the charge.
func (l *Ledger) Reserve(ctx context.Context, req ReserveRequest) (Claim, error) {
	if req.Owner == "" || req.Lease <= 0 || req.IdempotencyKey == "" {
		return Claim{}, errors.New("ledger: Reserve needs an owner, a positive lease and an idempotency key")
	}
	ev := req.Event
	now := l.clock.Now()
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return Claim{}, fmt.Errorf("reserving %s/%s: %w", ev.CustomerID, ev.BillingPeriod, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	claim, err := l.reserveTx(ctx, tx, req, now)
	if err != nil {
		return Claim{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Claim{}, fmt.Errorf("committing reservation of %s/%s: %w", ev.CustomerID, ev.BillingPeriod, err)
	}
	return claim, nil
}

func (l *Ledger) reserveTx(ctx context.Context, tx pgx.Tx, req ReserveRequest, now time.Time) (Claim, error) {
	ev := req.Event
	k := EventKey(ev)
	rec, err := scanRecord(tx.QueryRow(ctx, `
		INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents,
			currency, idempotency_key, status, lease_owner, lease_expires_at, epoch, attempts,
			first_attempt_at, attempt_started_at, stream_message_id, created_at, updated_at, attempt_epoch)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, `+firstEpoch+`, 1, $9, $9, $10, $9, $9, `+firstEpoch+`)
		ON CONFLICT DO NOTHING
		RETURNING `+recordCols,
		ev.CustomerID, ev.BillingPeriod, ev.StripeCustomerID, ev.AmountCents, ev.Currency,
		req.IdempotencyKey, req.Owner, now.Add(req.Lease), now, req.MessageID))
	switch {
	case err == nil:
		reserved, err := reserveCap(ctx, tx, ev.BillingPeriod, ev.AmountCents, req.RequireCap)
		if err != nil {
			return Claim{}, err
		}
		if reserved > 0 {
			if _, err := tx.Exec(ctx, `UPDATE {schema}.billing_records SET cap_reserved_cents = $3
				WHERE customer_id = $1 AND billing_period = $2`, k.CustomerID, k.BillingPeriod, reserved); err != nil {
				return Claim{}, fmt.Errorf("recording cap reservation for %s: %w", k, err)
			}
			rec.CapReservedCents = reserved
		}
		return Claim{Decision: Acquired, Record: rec}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return Claim{}, fmt.Errorf("inserting billing record %s: %w", k, err)
	}

	// The row exists (every unique index is an arbiter above, so two
	// concurrent first deliveries cannot fail on the idempotency key's index
	// instead of the primary key): lock it and decide.
	rec, err = scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE customer_id = $1 AND billing_period = $2 FOR UPDATE`, k.CustomerID, k.BillingPeriod))
	if err != nil {
		return Claim{}, fmt.Errorf("locking billing record %s: %w", k, err)
	}
	switch d := decideExisting(rec, req, now); d {
	case Reopened:
		return l.reopenTx(ctx, tx, rec, req.Owner, req.Lease, req.MessageID, req.RequireCap, now)
	case Conflict, AlreadyTerminal, Busy:
		return Claim{Decision: d, Record: rec}, nil
	}
	// Expired or released: take it over. The new epoch fences out whoever
	// held it before.
	rec, err = scanRecord(tx.QueryRow(ctx, `
		UPDATE {schema}.billing_records SET epoch = `+nextEpoch+`, attempts = attempts + 1, lease_owner = $3,
			lease_expires_at = $4, stream_message_id = $5, updated_at = $6
		WHERE customer_id = $1 AND billing_period = $2
		RETURNING `+recordCols,
		k.CustomerID, k.BillingPeriod, req.Owner, now.Add(req.Lease), req.MessageID, now))
	if err != nil {
		return Claim{}, fmt.Errorf("taking over billing record %s: %w", k, err)
	}
	return Claim{Decision: TakenOver, Record: rec}, nil
}

// decideExisting is what a delivery of req does with the row rec that
// already exists (read under its lock): Conflict, Reopened, AlreadyTerminal,
// Busy, or TakenOver. Reserve and ReserveBatch decide with it alike.
func decideExisting(rec Record, req ReserveRequest, now time.Time) Decision {
	ev := req.Event
	switch {
	case rec.StripeCustomerID != ev.StripeCustomerID || rec.AmountCents != ev.AmountCents ||
		rec.Currency != ev.Currency || rec.IdempotencyKey != req.IdempotencyKey:
		// Checked before the terminal state: acking a different event as
		// "already billed" would silently drop it.
		return Conflict
	case req.Replay && rec.Status.Reopenable():
		return Reopened
	case rec.Status.Terminal():
		return AlreadyTerminal
	case rec.LeaseLive(now):
		// Even when the owner has our name: a pinned name may be running
		// twice by mistake, or this very process may hold the row for an
		// earlier copy of the event. Only expiry (or a release) frees it.
		return Busy
	}
	return TakenOver
}

// reserveCap adds amount to the period's reservation if the cap allows it.
// It returns the amount reserved: 0 when the period has no cap (and caps are
// not required).
func reserveCap(ctx context.Context, tx pgx.Tx, period string, amount int64, require bool) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = reserved_cents + $2, updated_at = now()
		WHERE billing_period = $1 AND reserved_cents + $2 <= cap_cents`, period, amount)
	if err != nil {
		return 0, fmt.Errorf("reserving spend cap for %s: %w", period, err)
	}
	if tag.RowsAffected() == 1 {
		return amount, nil
	}
	var capCents, reserved int64
	err = tx.QueryRow(ctx, `SELECT cap_cents, reserved_cents FROM {schema}.spend_caps WHERE billing_period = $1`,
		period).Scan(&capCents, &reserved)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if require {
			return 0, fmt.Errorf("%s: %w", period, ErrNoCap)
		}
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("reading spend cap for %s: %w", period, err)
	}
	return 0, &CapError{Period: period, CapCents: capCents, ReservedCents: reserved, RequestedCents: amount}
}

// Extend renews the lease (the heartbeat). ErrLeaseLost means another
// holder took over or the row is no longer pending: stop working on it.
func (l *Ledger) Extend(ctx context.Context, rec Record, lease time.Duration) error {
	now := l.clock.Now()
	tag, err := l.pool.Exec(ctx, `UPDATE {schema}.billing_records SET lease_expires_at = $5, updated_at = $6
		WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND lease_owner = $4
		AND status = 'pending'`,
		rec.CustomerID, rec.BillingPeriod, rec.Epoch, rec.LeaseOwner, now.Add(lease), now)
	if err != nil {
		return fmt.Errorf("extending lease on %s: %w", rec.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("extending lease on %s (epoch %d): %w", rec.Key, rec.Epoch, ErrLeaseLost)
	}
	return nil
}

// Outcome is how a Stripe attempt ended.
type Outcome struct {
	Status   Status // charged, processing, declined, failed or action_required
	ChargeID string // required for charged and processing
	Error    string // decline or failure reason, for operators
	// PaymentIntentID is the attempt's intent, when Stripe made one.
	PaymentIntentID string
	// FailureCode is Stripe's decline_code or failure code.
	FailureCode string
	// RetryAt, for declined and failed: when the ledger re-drives the row
	// under the next attempt's key. Zero: final, never retried by itself.
	RetryAt time.Time
	// PollAt, for processing: when the pending charge is first read again.
	PollAt time.Time
}

// Finish records a terminal outcome, fenced by the caller's epoch, and
// releases the spend-cap reservation of a declined or failed row. Only
// after it returns nil may the stream entry be acked (invariant 3).
func (l *Ledger) Finish(ctx context.Context, rec Record, out Outcome) (Record, error) {
	now := l.clock.Now()
	switch out.Status {
	case StatusCharged:
		if out.ChargeID == "" {
			return Record{}, errors.New("ledger: a charged outcome needs a charge id")
		}
		var r Record
		err := l.witnessTx(ctx, func(tx pgx.Tx) error {
			if err := l.lockKeysShared(ctx, tx, rec.Key, StripeLockKey(rec.StripeCustomerID, rec.BillingPeriod)); err != nil {
				return err
			}
			var err error
			r, err = scanRecord(tx.QueryRow(ctx, `
				UPDATE {schema}.billing_records SET status = 'charged', charge_id = $4, charged_at = $5,
					lease_owner = NULL, lease_expires_at = NULL, last_error = NULL, updated_at = $5
				WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = 'pending'
					AND NOT EXISTS (SELECT 1 FROM {schema}.refund_ledger f WHERE f.charge_id = $4)
				RETURNING `+recordCols,
				rec.CustomerID, rec.BillingPeriod, rec.Epoch, out.ChargeID, now))
			if errors.Is(err, pgx.ErrNoRows) {
				var refunded bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.refund_ledger WHERE charge_id = $1)`,
					out.ChargeID).Scan(&refunded); err != nil {
					return fmt.Errorf("recording charge %s on %s: %w", out.ChargeID, rec.Key, err)
				}
				if refunded {
					return fmt.Errorf("recording charge %s on %s: %w", out.ChargeID, rec.Key, ErrChargeRefunded)
				}
				return fmt.Errorf("recording charge %s on %s (epoch %d): %w", out.ChargeID, rec.Key, rec.Epoch, ErrLeaseLost)
			}
			if err != nil {
				return fmt.Errorf("recording charge %s on %s: %w", out.ChargeID, rec.Key, err)
			}
			return nil
		})
		if err != nil {
			return Record{}, err
		}
		return r, nil
	case StatusProcessing:
		return l.finishProcessing(ctx, rec, out, now)
	case StatusDeclined, StatusFailed, StatusActionRequired:
		return l.finishUncharged(ctx, rec, out, now)
	}
	return Record{}, fmt.Errorf("ledger: %q is not a terminal status", out.Status)
}

// finishUncharged records Stripe's final failure of the row's current
// attempt: the only write that advances attempt (invariant 4), so the next
// Stripe call for the key, by a retry or a replay, uses a new key.
func (l *Ledger) finishUncharged(ctx context.Context, rec Record, out Outcome, now time.Time) (Record, error) {
	var r Record
	err := l.witnessTx(ctx, func(tx pgx.Tx) error {
		// The reservation belongs to the row, not to this holder: read what
		// the row has reserved under its lock, then release exactly that.
		var reserved int64
		err := tx.QueryRow(ctx, `SELECT cap_reserved_cents FROM {schema}.billing_records
			WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = 'pending'
			FOR UPDATE`, rec.CustomerID, rec.BillingPeriod, rec.Epoch).Scan(&reserved)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("recording %s on %s (epoch %d): %w", out.Status, rec.Key, rec.Epoch, ErrLeaseLost)
		}
		if err != nil {
			return fmt.Errorf("locking %s: %w", rec.Key, err)
		}
		r, err = scanRecord(tx.QueryRow(ctx, `
			UPDATE {schema}.billing_records SET status = $3, last_error = $4, cap_reserved_cents = 0,
				lease_owner = NULL, lease_expires_at = NULL, updated_at = $5, attempt = attempt + 1, debit = false,
				next_attempt_at = $6, payment_intent_id = coalesce(nullif($7, ''), payment_intent_id),
				failure_code = nullif($8, '')
			WHERE customer_id = $1 AND billing_period = $2
			RETURNING `+recordCols,
			rec.CustomerID, rec.BillingPeriod, string(out.Status), out.Error, now,
			nullTime(out.RetryAt), out.PaymentIntentID, out.FailureCode))
		if err != nil {
			return fmt.Errorf("recording %s on %s: %w", out.Status, rec.Key, err)
		}
		if reserved > 0 {
			if _, err := tx.Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = greatest(0, reserved_cents - $2),
				updated_at = $3 WHERE billing_period = $1`, rec.BillingPeriod, reserved, now); err != nil {
				return fmt.Errorf("releasing spend cap for %s: %w", rec.BillingPeriod, err)
			}
		}
		return nil
	})
	return r, err
}

// Release gives the lease up after a transient failure (timeout, 5xx, 429):
// the row stays pending and the next delivery takes it over with the same
// idempotency key.
func (l *Ledger) Release(ctx context.Context, rec Record, reason string) error {
	now := l.clock.Now()
	tag, err := l.pool.Exec(ctx, `UPDATE {schema}.billing_records SET lease_owner = NULL, lease_expires_at = NULL,
			last_error = $4, updated_at = $5
		WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = 'pending'`,
		rec.CustomerID, rec.BillingPeriod, rec.Epoch, reason, now)
	if err != nil {
		return fmt.Errorf("releasing lease on %s: %w", rec.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("releasing lease on %s (epoch %d): %w", rec.Key, rec.Epoch, ErrLeaseLost)
	}
	return nil
}

// ExtendMany renews many leases in one statement (the consumer's heartbeat
// covers every event it holds). It returns the keys whose lease was lost to
// someone else: the row is still pending under another epoch or owner. A row
// that is no longer pending (the event just finished, by us or by whoever
// took it over) is not reported: there is no work left to cancel, and
// counting it would make the lost-lease metric cry wolf.
func (l *Ledger) ExtendMany(ctx context.Context, recs []Record, lease time.Duration) ([]Key, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	now := l.clock.Now()
	cust := make([]string, len(recs))
	per := make([]string, len(recs))
	epochs := make([]int64, len(recs))
	owners := make([]string, len(recs))
	for i, r := range recs {
		cust[i], per[i], epochs[i], owners[i] = r.CustomerID, r.BillingPeriod, r.Epoch, r.LeaseOwner
	}
	// Rows someone has locked right now (our own committer finishing them,
	// or a Reserve deciding about them) are skipped, not waited for: waiting
	// would stall every renewal behind one busy row. A skipped row is simply
	// renewed at the next beat. Lost means what the statement's snapshot
	// shows: still pending, under another epoch or owner.
	rows, err := l.pool.Query(ctx, `
		WITH u AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(c, p, e, o)
		), mine AS (
			SELECT b.customer_id, b.billing_period FROM {schema}.billing_records b
			JOIN u ON b.customer_id = u.c AND b.billing_period = u.p
			WHERE b.epoch = u.e AND b.lease_owner = u.o AND b.status = 'pending'
			ORDER BY b.customer_id, b.billing_period
			FOR UPDATE OF b SKIP LOCKED
		), upd AS (
			UPDATE {schema}.billing_records b SET lease_expires_at = $5, updated_at = $6
			FROM mine WHERE b.customer_id = mine.customer_id AND b.billing_period = mine.billing_period
			RETURNING 1
		)
		SELECT u.c, u.p FROM u
		JOIN {schema}.billing_records b ON b.customer_id = u.c AND b.billing_period = u.p
		WHERE b.status = 'pending' AND (b.epoch <> u.e OR b.lease_owner IS DISTINCT FROM u.o)`,
		cust, per, epochs, owners, now.Add(lease), now)
	if err != nil {
		return nil, fmt.Errorf("extending %d leases: %w", len(recs), err)
	}
	defer rows.Close()
	var lost []Key
	for rows.Next() {
		var k Key
		if err := rows.Scan(&k.CustomerID, &k.BillingPeriod); err != nil {
			return nil, fmt.Errorf("extending leases: %w", err)
		}
		lost = append(lost, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("extending %d leases: %w", len(recs), err)
	}
	return lost, nil
}
