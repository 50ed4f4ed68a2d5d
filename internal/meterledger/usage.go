package meterledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reads for the auditor's usage reconciliation (package audit, usage*.go;
// issue 29). They only read meter_events; StageWindowTotals writes the
// auditor's own scratch table usage_stage (migration 00015), here because
// this package alone reads meter_events.

// StageWindowTotals aggregates, in one statement, the delivered events with
// timestamps in [dailyFrom, to) into usage_stage under runID: per meter,
// Stripe customer and window — a UTC day for events before hourlyFrom, an
// hour from it on — their sum and count. dailyFrom and hourlyFrom must be
// UTC midnights and to an hour, as Stripe's summaries align their windows.
// It returns the number of windows staged. Nothing of the ledger passes
// through the caller's memory.
func (l *Ledger) StageWindowTotals(ctx context.Context, runID int64, dailyFrom, hourlyFrom, to time.Time) (int64, error) {
	if dailyFrom.After(hourlyFrom) || hourlyFrom.After(to) {
		return 0, fmt.Errorf("meter ledger: staging windows: want dailyFrom <= hourlyFrom <= to, got %s, %s, %s", dailyFrom, hourlyFrom, to)
	}
	tag, err := l.pool.Exec(ctx, `INSERT INTO {schema}.usage_stage
			(run_id, event_name, stripe_customer_id, window_start, window_end, value, events)
		SELECT $1, m.event_name, m.stripe_customer_id, w.s, w.s + w.width, sum(m.value), count(*)
		FROM {schema}.meter_events m
		CROSS JOIN LATERAL (SELECT
			CASE WHEN m.event_ts >= $3 THEN date_trunc('hour', m.event_ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
			     ELSE date_trunc('day', m.event_ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' END AS s,
			CASE WHEN m.event_ts >= $3 THEN interval '1 hour' ELSE interval '24 hours' END AS width) w
		WHERE m.status = 'delivered' AND m.event_ts >= $2 AND m.event_ts < $4
		GROUP BY m.event_name, m.stripe_customer_id, w.s, w.width`, runID, dailyFrom, hourlyFrom, to)
	if err != nil {
		return 0, fmt.Errorf("staging delivered meter totals of run %d: %w", runID, err)
	}
	return tag.RowsAffected(), nil
}

// WindowEvent is a delivered event as a re-send needs it.
type WindowEvent struct {
	Identifier  string
	EventTS     time.Time
	Value       int64
	FirstSentAt time.Time
}

// DeliveredInWindow returns the delivered events of eventName and
// customer with timestamps in [from, to), oldest first, at most limit of
// them; more reports that the window holds more than limit.
func (l *Ledger) DeliveredInWindow(ctx context.Context, eventName, customer string, from, to time.Time, limit int) (evs []WindowEvent, more bool, err error) {
	rows, err := l.pool.Query(ctx, `SELECT identifier, event_ts, value, first_sent_at FROM {schema}.meter_events
		WHERE status = 'delivered' AND event_name = $1 AND stripe_customer_id = $2 AND event_ts >= $3 AND event_ts < $4
		ORDER BY event_ts, identifier LIMIT $5`, eventName, customer, from, to, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("reading delivered %s events of %s: %w", eventName, customer, err)
	}
	evs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (WindowEvent, error) {
		var e WindowEvent
		err := r.Scan(&e.Identifier, &e.EventTS, &e.Value, &e.FirstSentAt)
		e.EventTS, e.FirstSentAt = e.EventTS.UTC(), e.FirstSentAt.UTC()
		return e, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("reading delivered %s events of %s: %w", eventName, customer, err)
	}
	if len(evs) > limit {
		return evs[:limit], true, nil
	}
	return evs, false, nil
}

// Undecided counts the events of eventName and customer with timestamps in
// [from, to) whose outcome at Stripe is not known: parked (past the safe
// window, or parked by a ledger repair) or still sending. Stripe may count
// them while the ledger's delivered total does not, so a window over at
// Stripe by no more than their units may be pelguard's own usage
// (invariant 13): never taken back automatically.
func (l *Ledger) Undecided(ctx context.Context, eventName, customer string, from, to time.Time) (events, units int64, err error) {
	err = l.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(value), 0)::bigint FROM {schema}.meter_events
		WHERE status IN ('parked', 'sending') AND event_name = $1 AND stripe_customer_id = $2 AND event_ts >= $3 AND event_ts < $4`,
		eventName, customer, from, to).Scan(&events, &units)
	if err != nil {
		return 0, 0, fmt.Errorf("counting undecided %s events of %s: %w", eventName, customer, err)
	}
	return events, units, nil
}
