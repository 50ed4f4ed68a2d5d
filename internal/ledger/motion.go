package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/stripeapi"
)

// Money in motion (DESIGN.md invariant 10): rows the ledger itself follows
// after the stream entry was acked. A processing row's pending charge is
// read again until Stripe says it is final (DuePolls, Settle); a declined
// row with a due NextAttemptAt is charged again under its next attempt's
// key (TakeDue), through the consumer's per-event code.

// ErrNotInMotion is Settle's answer when the row no longer waits for the
// charge it names (settled already, by a poll or a webhook): nothing to do.
var ErrNotInMotion = errors.New("ledger: the row is not processing that charge")

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// finishProcessing records a pending charge (a bank debit in motion),
// fenced like every outcome: the lease goes, the spend-cap reservation
// stays (the money is on its way), and the row is polled from PollAt.
func (l *Ledger) finishProcessing(ctx context.Context, rec Record, out Outcome, now time.Time) (Record, error) {
	if out.ChargeID == "" {
		return Record{}, errors.New("ledger: a processing outcome needs the pending charge's id")
	}
	poll := out.PollAt
	if poll.IsZero() {
		poll = now
	}
	var r Record
	err := l.witnessTx(ctx, func(tx pgx.Tx) error {
		var err error
		r, err = scanRecord(tx.QueryRow(ctx, `
		UPDATE {schema}.billing_records SET status = 'processing', charge_id = $4, payment_intent_id = nullif($5, ''),
			next_poll_at = $6, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL, updated_at = $7
		WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = 'pending'
		RETURNING `+recordCols,
			rec.CustomerID, rec.BillingPeriod, rec.Epoch, out.ChargeID, out.PaymentIntentID, poll, now))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("recording processing charge %s on %s (epoch %d): %w", out.ChargeID, rec.Key, rec.Epoch, ErrLeaseLost)
	}
	if err != nil {
		return Record{}, fmt.Errorf("recording processing charge %s on %s: %w", out.ChargeID, rec.Key, err)
	}
	return r, nil
}

// reopenTx starts the row's current attempt (already advanced by the write
// that recorded the last one's final failure): a new epoch, a lease, the
// spend cap reserved again. The caller charges under AttemptKey(Attempt).
func (l *Ledger) reopenTx(ctx context.Context, tx pgx.Tx, rec Record, owner string, lease time.Duration, msgID string, requireCap bool, now time.Time) (Claim, error) {
	reserved, err := reserveCap(ctx, tx, rec.BillingPeriod, rec.AmountCents, requireCap)
	if err != nil {
		return Claim{}, err
	}
	r, err := scanRecord(tx.QueryRow(ctx, `
		UPDATE {schema}.billing_records SET status = 'pending', epoch = `+nextEpoch+`, attempts = attempts + 1,
			attempt_epoch = `+nextEpoch+`, attempt_started_at = $3, lease_owner = $4, lease_expires_at = $5,
			stream_message_id = coalesce(nullif($6, ''), stream_message_id), next_attempt_at = NULL,
			cap_reserved_cents = $7, updated_at = $3, redrives = 0, parked_at = NULL, parked_reason = NULL
		WHERE customer_id = $1 AND billing_period = $2
		RETURNING `+recordCols,
		rec.CustomerID, rec.BillingPeriod, now, owner, now.Add(lease), msgID, reserved))
	if err != nil {
		return Claim{}, fmt.Errorf("reopening billing record %s for attempt %d: %w", rec.Key, rec.Attempt, err)
	}
	return Claim{Decision: Reopened, Record: r}, nil
}

// LedgerDriven is the stream_message_id of a row a ledger retry holds: no
// stream entry will come back for it, so when its holder released it (a
// transient Stripe error) or died, TakeDue takes it over as a delivery
// would, with the same attempt's key and the same safe-window rule.
const LedgerDriven = "ledger"

// ReleasedRetryDelay is how long a ledger-driven row released after a
// transient failure waits before TakeDue takes it again the first time (a
// delivery-driven one waits for the reaper's min-idle the same way). Each
// later takeover of the same attempt waits twice as long as the one before,
// up to MaxReleasedRetryDelay: a Stripe outage of hours is ridden out with
// a few dozen calls, and a release that repeats for good (an earlier
// attempt's intent that answers 403) reaches the takeover budget, where the
// consumer parks the row (Park), in hours rather than never.
const (
	ReleasedRetryDelay    = time.Minute
	MaxReleasedRetryDelay = time.Hour
)

// DueRetry is TakeDue's answer.
type DueRetry struct {
	Claim Claim
	// CapErr is set (and Claim empty) when the spend cap forbids the
	// retry: the retry was pushed back by Backoff and nothing was taken.
	CapErr error
	Record Record // the row as it was, for CapErr's alert
}

// TakeDue takes the lease on one row the ledger must drive: a row whose
// retry is due (a soft decline or a retryable failed debit, NextAttemptAt
// <= now), reopened for its next attempt; or a ledger-driven row left
// pending without a live lease (its retry failed transiently, or its
// holder died), taken over within its attempt. ok is false when there is
// none. Rows another taker is deciding are skipped, never waited for. When
// the spend cap forbids a retry, it moves backoff later and
// DueRetry.CapErr says why.
func (l *Ledger) TakeDue(ctx context.Context, owner string, lease, backoff time.Duration, requireCap bool) (DueRetry, bool, error) {
	now := l.clock.Now()
	var out DueRetry
	found := false
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		rec, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
			WHERE (next_attempt_at <= $1 AND status IN ('declined', 'failed', 'action_required'))
				OR (status = 'pending' AND stream_message_id = $2 AND parked_at IS NULL
					AND (lease_expires_at <= $1 OR (lease_expires_at IS NULL
						AND updated_at <= $1 - least($4::interval, $3::interval * power(2, least(redrives, 20))))))
			ORDER BY coalesce(next_attempt_at, updated_at) LIMIT 1 FOR UPDATE SKIP LOCKED`,
			now, LedgerDriven, ReleasedRetryDelay, MaxReleasedRetryDelay))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("finding a due retry: %w", err)
		}
		found = true
		out.Record = rec
		if rec.Status == StatusPending {
			r, err := scanRecord(tx.QueryRow(ctx, `
				UPDATE {schema}.billing_records SET epoch = `+nextEpoch+`, attempts = attempts + 1, lease_owner = $3,
					lease_expires_at = $4, updated_at = $5, redrives = redrives + 1
				WHERE customer_id = $1 AND billing_period = $2
				RETURNING `+recordCols, rec.CustomerID, rec.BillingPeriod, owner, now.Add(lease), now))
			out.Claim = Claim{Decision: TakenOver, Record: r}
			return err
		}
		claim, err := l.reopenTx(ctx, tx, rec, owner, lease, LedgerDriven, requireCap, now)
		if errors.Is(err, ErrSpendCap) || errors.Is(err, ErrNoCap) {
			out.CapErr = err
			_, uerr := tx.Exec(ctx, `UPDATE {schema}.billing_records SET next_attempt_at = $3, updated_at = $4
				WHERE customer_id = $1 AND billing_period = $2`, rec.CustomerID, rec.BillingPeriod, now.Add(backoff), now)
			return uerr
		}
		out.Claim = claim
		return err
	})
	if err != nil {
		return DueRetry{}, false, err
	}
	return out, found, nil
}

// DuePolls returns up to limit processing rows whose poll is due and moves
// each one's next poll later, in one statement, so two pollers do not read
// the same charge at once: the next poll comes after a quarter of the time
// the charge has been in motion, between minGap and maxGap.
func (l *Ledger) DuePolls(ctx context.Context, limit int, minGap, maxGap time.Duration) ([]Record, error) {
	now := l.clock.Now()
	rows, err := l.pool.Query(ctx, `
		WITH due AS (
			SELECT customer_id AS c, billing_period AS p FROM {schema}.billing_records
			WHERE status = 'processing' AND next_poll_at <= $1
			ORDER BY next_poll_at LIMIT $2 FOR UPDATE SKIP LOCKED
		)
		UPDATE {schema}.billing_records SET next_poll_at = $1 + least($4::interval,
			greatest($3::interval, ($1 - coalesce(attempt_started_at, first_attempt_at)) / 4))
		FROM due WHERE customer_id = due.c AND billing_period = due.p
		RETURNING `+recordCols, now, limit, minGap, maxGap)
	if err != nil {
		return nil, fmt.Errorf("finding due polls: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning a due poll: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Settlement is Stripe's final word on a processing row's pending charge.
type Settlement struct {
	ChargeID  string
	Succeeded bool
	// For a failed charge: Stripe's failure code and message, and when the
	// ledger retries it under the next attempt's key (zero: final).
	FailureCode string
	Error       string
	RetryAt     time.Time
}

// Settle records the end of a processing row's money in motion: charged
// (with the charge it was waiting for) or declined, the attempt advanced
// and the spend cap released, with a retry at RetryAt if set. Fenced by the
// status and the charge id, so a poll and a webhook, or a replayed webhook,
// settle it once: the later ones get ErrNotInMotion.
func (l *Ledger) Settle(ctx context.Context, k Key, s Settlement) (Record, error) {
	now := l.clock.Now()
	var r Record
	err := l.witnessTx(ctx, func(tx pgx.Tx) error {
		cur, err := scanRecord(tx.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
			WHERE customer_id = $1 AND billing_period = $2 AND status = 'processing' AND charge_id = $3
			FOR UPDATE`, k.CustomerID, k.BillingPeriod, s.ChargeID))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("settling %s with charge %s: %w", k, s.ChargeID, ErrNotInMotion)
		}
		if err != nil {
			return fmt.Errorf("settling %s: %w", k, err)
		}
		if s.Succeeded {
			if err := l.lockKeysShared(ctx, tx, k, StripeLockKey(cur.StripeCustomerID, cur.BillingPeriod)); err != nil {
				return err
			}
			r, err = scanRecord(tx.QueryRow(ctx, `
				UPDATE {schema}.billing_records SET status = 'charged', charged_at = $3, next_poll_at = NULL,
					updated_at = $3
				WHERE customer_id = $1 AND billing_period = $2
				RETURNING `+recordCols, k.CustomerID, k.BillingPeriod, now))
			if err != nil {
				return fmt.Errorf("recording the settled charge %s on %s: %w", s.ChargeID, k, err)
			}
			return nil
		}
		r, err = scanRecord(tx.QueryRow(ctx, `
			UPDATE {schema}.billing_records SET status = 'declined', charge_id = NULL, next_poll_at = NULL, debit = true,
				last_error = $3, failure_code = nullif($4, ''), next_attempt_at = $5, attempt = attempt + 1,
				cap_reserved_cents = 0, updated_at = $6
			WHERE customer_id = $1 AND billing_period = $2
			RETURNING `+recordCols, k.CustomerID, k.BillingPeriod,
			truncate(fmt.Sprintf("charge %s failed: %s", s.ChargeID, s.Error), 500), s.FailureCode, nullTime(s.RetryAt), now))
		if err != nil {
			return fmt.Errorf("recording the failed charge %s on %s: %w", s.ChargeID, k, err)
		}
		return ReleaseCap(ctx, tx, k.BillingPeriod, cur.CapReservedCents)
	})
	return r, err
}

// ByPaymentRef finds the row a webhook's object is about: the one whose
// charge_id or payment_intent_id is one of ids (a charge and its intent),
// a processing row first. ErrNotFound when none.
func (l *Ledger) ByPaymentRef(ctx context.Context, ids ...string) (Record, error) {
	r, err := scanRecord(l.pool.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE charge_id = ANY($1::text[]) OR payment_intent_id = ANY($1::text[])
		ORDER BY (status = 'processing') DESC LIMIT 1`, ids))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%v: %w", ids, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("finding the row of %v: %w", ids, err)
	}
	return r, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// WebhookEventSeen reports whether a Stripe event id was already applied.
func (l *Ledger) WebhookEventSeen(ctx context.Context, id string) (bool, error) {
	var seen bool
	if err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.webhook_events WHERE event_id = $1)`, id).Scan(&seen); err != nil {
		return false, fmt.Errorf("looking up webhook event %s: %w", id, err)
	}
	return seen, nil
}

// RecordWebhookEvent remembers a Stripe event once it was applied (its
// ledger write committed first), so a replay of it is answered at once.
func (l *Ledger) RecordWebhookEvent(ctx context.Context, id, typ, objectID, result string) error {
	_, err := l.pool.Exec(ctx, `INSERT INTO {schema}.webhook_events (event_id, type, object_id, received_at, result)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING`, id, typ, objectID, l.clock.Now(), result)
	if err != nil {
		return fmt.Errorf("recording webhook event %s: %w", id, err)
	}
	return nil
}

// PruneWebhookEvents deletes up to limit remembered webhook events
// received before before, oldest first, and returns how many it deleted.
// Stripe retries an event for up to three days and the handler refuses a
// signature older than its tolerance, so an event id older than that is
// never presented again by Stripe.
func (l *Ledger) PruneWebhookEvents(ctx context.Context, before time.Time, limit int) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM {schema}.webhook_events WHERE event_id IN (
		SELECT event_id FROM {schema}.webhook_events WHERE received_at < $1 ORDER BY received_at LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("pruning webhook events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Park stops the ledger's own retries of a ledger-driven pending row whose
// takeover budget ran out (the consumer decides when): the lease goes, the
// row stays pending and unbilled, and it is reported as stuck until a
// person takes it up with ScheduleRetries. Fenced by the holder's epoch.
func (l *Ledger) Park(ctx context.Context, rec Record, reason string) (Record, error) {
	now := l.clock.Now()
	var r Record
	err := l.witnessTx(ctx, func(tx pgx.Tx) error {
		var err error
		r, err = scanRecord(tx.QueryRow(ctx, `
		UPDATE {schema}.billing_records SET lease_owner = NULL, lease_expires_at = NULL, parked_at = $4,
			parked_reason = $5, last_error = $5, updated_at = $4
		WHERE customer_id = $1 AND billing_period = $2 AND epoch = $3 AND status = 'pending'
		RETURNING `+recordCols, rec.CustomerID, rec.BillingPeriod, rec.Epoch, now, truncate(reason, 500)))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("parking %s (epoch %d): %w", rec.Key, rec.Epoch, ErrLeaseLost)
	}
	if err != nil {
		return Record{}, fmt.Errorf("parking %s: %w", rec.Key, err)
	}
	return r, nil
}

// RetryCandidates reads the rows of period (one customer's when customerID
// is set) a person may bill again: those whose last attempt failed for good
// (declined, failed, action_required) and those the ledger parked. What
// may be retried among them is RetryRefusal's to say.
func (l *Ledger) RetryCandidates(ctx context.Context, period, customerID string) ([]Record, error) {
	var out []Record
	err := l.scan(ctx, `SELECT `+recordCols+` FROM {schema}.billing_records
		WHERE billing_period = $1 AND ($2 = '' OR customer_id = $2)
			AND (status IN ('declined', 'failed', 'action_required') OR (status = 'pending' AND parked_at IS NOT NULL))
		ORDER BY customer_id`, func(r Record) error { out = append(out, r); return nil }, period, customerID)
	return out, err
}

// RetryRefusal says why a person's retry of the row breaks a rule of bank
// debits, or "" when it may be retried. A failed debit is re-presented only
// for a code a re-presentment can overcome (insufficient funds) and at most
// stripeapi.MaxDebitRepresentments times (NACHA); a revoked authorisation,
// a closed or unknown account, or the used-up re-presentments need the
// customer's new authorisation (a new mandate), which only a person can
// vouch for: `consumer retry --override "why"`. Cards and parked rows have
// no such rule.
func (r Record) RetryRefusal() string {
	if !r.Debit || r.Status != StatusDeclined {
		return ""
	}
	if !stripeapi.DebitRetryable(r.FailureCode) {
		return fmt.Sprintf("bank debit failed with %s: re-presenting it needs the customer's new authorisation (a new mandate)",
			cmp.Or(r.FailureCode, "no failure code"))
	}
	// Attempt was advanced past the failed one: attempts made = Attempt-1,
	// re-presentments among them = Attempt-2.
	if used := r.Attempt - 2; used >= stripeapi.MaxDebitRepresentments {
		return fmt.Sprintf("bank debit already re-presented %d times (NACHA allows %d): a new presentment needs the customer's new authorisation",
			used, stripeapi.MaxDebitRepresentments)
	}
	return ""
}

// ScheduleRetries schedules, now, the next attempt of keys (RetryCandidates
// a person chose): a final failure gets a due next_attempt_at (its attempt
// was advanced when the failure was recorded, so the retry uses a new key);
// a parked row is unparked with a fresh takeover budget, due at once. A row
// that is neither any more is left alone. override, when set, is recorded
// on each row (`consumer retry --override`). A consumer's FollowUp charges
// them. It returns the rows scheduled.
func (l *Ledger) ScheduleRetries(ctx context.Context, keys []Key, override string) ([]Record, error) {
	now := l.clock.Now()
	cust, per := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		cust[i], per[i] = k.CustomerID, k.BillingPeriod
	}
	rows, err := l.pool.Query(ctx, `UPDATE {schema}.billing_records SET
			next_attempt_at = CASE WHEN status = 'pending' THEN NULL ELSE least(coalesce(next_attempt_at, $3), $3) END,
			parked_at = NULL, parked_reason = NULL, redrives = 0,
			updated_at = CASE WHEN status = 'pending' THEN $3 - $5::interval ELSE $3 END,
			retry_override = coalesce(nullif($4, ''), retry_override)
		WHERE (customer_id, billing_period) IN (SELECT * FROM unnest($1::text[], $2::text[]))
			AND (status IN ('declined', 'failed', 'action_required') OR (status = 'pending' AND parked_at IS NOT NULL))
		RETURNING `+recordCols, cust, per, now, override, ReleasedRetryDelay)
	if err != nil {
		return nil, fmt.Errorf("scheduling %d retries: %w", len(keys), err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scheduling retries: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
