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

// UnknownSQL is true for a row of meter_events m that Stripe may or may
// not count when its summary is read: sending (in flight, or its reply
// lost; alone or in an aggregate), parked, failed after an earlier attempt
// of unknown outcome and not settled by a person (rows recorded before such
// events were parked instead), or queued (recorded at ingest and not sent
// when the ledger was read: a sender may send it before Stripe's summary is
// read; one queued again after an attempt of unknown outcome may be there
// already). The usage reconciliation neither counts it as delivered nor
// takes it back: an unsent event is never an over-count to cancel.
const UnknownSQL = `(m.status IN ('queued', 'sending', 'parked') OR (m.status = 'failed' AND m.outcome_unknown AND m.settled_at IS NULL))`

// StageWindowTotals aggregates, in one statement, the events with
// timestamps in [dailyFrom, to) into usage_stage under runID: per meter,
// Stripe customer and window — a UTC day for events before hourlyFrom, an
// hour from it on — the delivered events' sum and count, the negative and
// positive values and the count of the events of unknown outcome
// (UnknownSQL), and the window's last delivery (the latest delivered_at or
// first attempt). dailyFrom and hourlyFrom must be UTC midnights and to an
// hour, as Stripe's summaries align their windows. It returns the number of
// windows staged. Nothing of the ledger passes through the caller's memory.
func (l *Ledger) StageWindowTotals(ctx context.Context, runID int64, dailyFrom, hourlyFrom, to time.Time) (int64, error) {
	if dailyFrom.After(hourlyFrom) || hourlyFrom.After(to) {
		return 0, fmt.Errorf("meter ledger: staging windows: want dailyFrom <= hourlyFrom <= to, got %s, %s, %s", dailyFrom, hourlyFrom, to)
	}
	tag, err := l.pool.Exec(ctx, `INSERT INTO {schema}.usage_stage
			(run_id, event_name, stripe_customer_id, window_start, window_end, value, events,
			 unknown_low, unknown_high, unknown_events, last_delivery)
		SELECT $1, m.event_name, m.stripe_customer_id, w.s, w.s + w.width,
			coalesce(sum(m.value) FILTER (WHERE NOT k.unk), 0), count(*) FILTER (WHERE NOT k.unk),
			coalesce(sum(least(m.value, 0)) FILTER (WHERE k.unk), 0), coalesce(sum(greatest(m.value, 0)) FILTER (WHERE k.unk), 0),
			count(*) FILTER (WHERE k.unk), max(greatest(m.delivered_at, m.first_sent_at))
		FROM {schema}.meter_events m
		CROSS JOIN LATERAL (SELECT
			CASE WHEN m.event_ts >= $3 THEN date_trunc('hour', m.event_ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
			     ELSE date_trunc('day', m.event_ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' END AS s,
			CASE WHEN m.event_ts >= $3 THEN interval '1 hour' ELSE interval '24 hours' END AS width) w
		CROSS JOIN LATERAL (SELECT m.status <> 'delivered' AS unk) k
		WHERE (m.status = 'delivered' OR `+UnknownSQL+`) AND m.event_ts >= $2 AND m.event_ts < $4
		GROUP BY m.event_name, m.stripe_customer_id, w.s, w.width`, runID, dailyFrom, hourlyFrom, to)
	if err != nil {
		return 0, fmt.Errorf("staging delivered meter totals of run %d: %w", runID, err)
	}
	return tag.RowsAffected(), nil
}

// UnknownEvent is an event of unknown outcome, as a usage finding names it.
type UnknownEvent struct {
	Key
	Status      Status
	Value       int64
	FirstSentAt time.Time
	LastError   string
}

// UnknownInWindow returns the events of eventName and customer with
// timestamps in [from, to) whose outcome at Stripe is unknown (UnknownSQL),
// oldest first, at most limit, and how many there are in all.
func (l *Ledger) UnknownInWindow(ctx context.Context, eventName, customer string, from, to time.Time, limit int) ([]UnknownEvent, int, error) {
	rows, err := l.pool.Query(ctx, `SELECT m.event_ts, m.identifier, m.status, m.value, m.first_sent_at, coalesce(m.last_error, ''),
			count(*) OVER ()
		FROM {schema}.meter_events m
		WHERE m.event_name = $1 AND m.stripe_customer_id = $2 AND m.event_ts >= $3 AND m.event_ts < $4 AND `+UnknownSQL+`
		ORDER BY m.event_ts, m.identifier LIMIT $5`, eventName, customer, from, to, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s events of unknown outcome of %s: %w", eventName, customer, err)
	}
	total := 0
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnknownEvent, error) {
		var e UnknownEvent
		var st string
		err := r.Scan(&e.EventTS, &e.Identifier, &st, &e.Value, &e.FirstSentAt, &e.LastError, &total)
		e.Status, e.EventTS, e.FirstSentAt = Status(st), e.EventTS.UTC(), e.FirstSentAt.UTC()
		return e, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s events of unknown outcome of %s: %w", eventName, customer, err)
	}
	return evs, total, nil
}

// WindowEvent is a delivered call as a re-send needs it: an event sent
// alone, or an aggregate (its identifier, second and value: the sum of its
// members).
type WindowEvent struct {
	Identifier  string
	EventTS     time.Time
	Value       int64
	FirstSentAt time.Time
}

// DeliveredInWindow returns the delivered calls of eventName and customer
// with timestamps in [from, to), oldest first, at most limit of them; more
// reports that the window holds more than limit. An event delivered inside
// an aggregate is not returned on its own: its aggregate is, under the
// identifier Stripe saw (a re-send of a member under its own identifier
// would be counted again). Windows are whole hours or days and an
// aggregate's bucket (a width dividing an hour, aligned to it: CheckBucket)
// lies inside one hour, so its start, the timestamp Stripe keeps, and its
// members fall in the same window.
func (l *Ledger) DeliveredInWindow(ctx context.Context, eventName, customer string, from, to time.Time, limit int) (evs []WindowEvent, more bool, err error) {
	rows, err := l.pool.Query(ctx, `SELECT identifier, event_ts, value, first_sent_at FROM (
			SELECT identifier, event_ts, value, first_sent_at FROM {schema}.meter_events
			WHERE status = 'delivered' AND aggregate IS NULL AND event_name = $1 AND stripe_customer_id = $2 AND event_ts >= $3 AND event_ts < $4
			UNION ALL
			SELECT identifier, second, value, first_sent_at FROM {schema}.meter_aggregates
			WHERE status = 'delivered' AND event_name = $1 AND stripe_customer_id = $2 AND second >= $3 AND second < $4) d
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
