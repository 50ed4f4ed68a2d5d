package meterledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotUnknown: the event's outcome is known (delivered, failed for good,
// settled) or it is still being sent: there is nothing to settle.
var ErrNotUnknown = errors.New("the meter event's outcome is not unknown")

// Settlement is a person's word on an event of unknown outcome, after
// checking the meter's events at Stripe.
type Settlement struct {
	Key Key
	// Counted: Stripe has the event (it is recorded delivered) or not (it is
	// recorded failed, its units taken back from its customer's use, and a
	// replay sends it).
	Counted bool
	By      string // who checked
	Reason  string // what they saw
}

// Settle records a person's settlement of a parked event (or a failed one
// whose earlier attempt's outcome was unknown): its window is then compared
// exactly again by the usage reconciliation. Who, when and why are kept on
// the row (settled_by, settled_at, settle_reason). ErrNotFound: no such
// row; ErrNotUnknown: nothing to settle.
func (l *Ledger) Settle(ctx context.Context, s Settlement) (Record, error) {
	if strings.TrimSpace(s.By) == "" || strings.TrimSpace(s.Reason) == "" {
		return Record{}, errors.New("meter ledger: a settlement needs who checked and what they saw")
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	status, note := StatusFailed, fmt.Sprintf("settled as not counted at Stripe by %s at %s: %s", s.By, now.Format(time.RFC3339), s.Reason)
	if s.Counted {
		status, note = StatusDelivered, ""
	}
	// A parked event counts in its customer's use; a failed one does not:
	// the use follows the settlement.
	row, found, err := scanRecord(l.pool.QueryRow(ctx, `WITH prev AS (
			SELECT m.status FROM {schema}.meter_events m
			WHERE m.event_ts = $1 AND m.identifier = $2 AND (m.status = 'parked' OR (m.status = 'failed' AND m.outcome_unknown AND m.settled_at IS NULL))
			FOR UPDATE
		), upd AS (
			UPDATE {schema}.meter_events m SET status = $3, delivered_at = CASE WHEN $3 = 'delivered' THEN $5::timestamptz END,
				last_error = CASE WHEN $3 = 'delivered' THEN m.last_error ELSE $4 END,
				settled_at = $5, settled_by = $6, settle_reason = $7
			FROM prev WHERE m.event_ts = $1 AND m.identifier = $2
			RETURNING m.*, prev.status AS prev_status
		), counted AS (
			INSERT INTO {schema}.meter_usage AS u (event_name, stripe_customer_id, month, units, events, updated_at)
			SELECT event_name, stripe_customer_id, `+monthSQL("event_ts")+`, value, 1, $5 FROM upd
			WHERE prev_status = 'failed' AND status = 'delivered'
			ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE
				SET units = u.units + EXCLUDED.units, events = u.events + 1, updated_at = EXCLUDED.updated_at
		), uncounted AS (
			`+uncountSQL("upd WHERE prev_status = 'parked' AND status = 'failed'", "$5")+`
		)
		SELECT `+cols("w")+` FROM upd w`, s.Key.EventTS, s.Key.Identifier, string(status), note, now, s.By, s.Reason))
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !found {
		if _, gerr := l.Get(ctx, s.Key); gerr != nil {
			return Record{}, gerr
		}
		return Record{}, fmt.Errorf("%s: %w", s.Key, ErrNotUnknown)
	}
	if err != nil {
		return Record{}, fmt.Errorf("settling meter event %s: %w", s.Key, err)
	}
	return row, nil
}
