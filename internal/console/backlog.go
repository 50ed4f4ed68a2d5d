package console

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/pg"
)

// A meter consumer run with --send-from-ledger records each usage event in
// the meter ledger as queued and acks its stream entry at once; its senders
// then send from the ledger. The stream's pending entries no longer show
// what is left to send: the ledger's queued and sending rows do. These
// reads say it per customer and meter, and per stream for the PEL page.

// meterBacklog is what is recorded and not yet sent, or in flight, for
// one meter of a customer (or one stream).
type meterBacklog struct {
	EventName string
	// Queued: recorded at ingest, not sent yet (known not to be at
	// Stripe); QueuedUnits their values; Oldest when the oldest of them
	// was recorded.
	Queued      int64
	QueuedUnits int64
	Oldest      *time.Time
	// Sending: in flight, or of unknown outcome and sent again under the
	// same identifier (alone, or in an aggregate).
	Sending int64
}

// Age is how long the oldest queued event has waited, at now.
func (b meterBacklog) Age(now time.Time) time.Duration {
	if b.Oldest == nil {
		return 0
	}
	return max(0, now.Sub(*b.Oldest))
}

// qCustomerBacklog reads a customer's queued and sending rows through the
// small partial indexes of those statuses, never the customer's delivered
// history.
const qCustomerBacklog = `SELECT event_name, count(*) FILTER (WHERE status = 'queued'),
	coalesce(sum(value) FILTER (WHERE status = 'queued'), 0)::bigint,
	min(created_at) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'sending')
FROM (SELECT event_name, status, value, created_at FROM {schema}.meter_events WHERE status = 'queued' AND stripe_customer_id = $1
	UNION ALL
	SELECT event_name, status, value, created_at FROM {schema}.meter_events WHERE status = 'sending' AND stripe_customer_id = $1) m
WHERE $2 = '' OR event_name = $2
GROUP BY event_name ORDER BY event_name`

// customerBacklog is, per meter of customer (of meter alone when given),
// its queued and sending events.
func customerBacklog(ctx context.Context, db pg.DB, customer, meter string) ([]meterBacklog, error) {
	rows, err := db.Query(ctx, qCustomerBacklog, customer, meter)
	if err != nil {
		return nil, fmt.Errorf("reading the meter backlog of %s: %w", customer, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[meterBacklog])
	if err != nil {
		return nil, fmt.Errorf("reading the meter backlog of %s: %w", customer, err)
	}
	return out, nil
}

// streamBacklog is the stream's queued and sending events (EventName
// empty), and how many customer-meters have something queued.
type streamBacklog struct {
	meterBacklog
	Customers int64
}

const qStreamBacklog = `SELECT count(*) FILTER (WHERE status = 'queued'), coalesce(sum(value) FILTER (WHERE status = 'queued'), 0)::bigint,
	min(created_at) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'sending'),
	count(DISTINCT (stripe_customer_id, event_name)) FILTER (WHERE status = 'queued')
FROM (SELECT stripe_customer_id, event_name, status, value, created_at FROM {schema}.meter_events WHERE status = 'queued' AND stream = $1
	UNION ALL
	SELECT stripe_customer_id, event_name, status, value, created_at FROM {schema}.meter_events WHERE status = 'sending' AND stream = $1) m`

func backlogOfStream(ctx context.Context, db pg.DB, stream string) (streamBacklog, error) {
	var b streamBacklog
	err := db.QueryRow(ctx, qStreamBacklog, stream).Scan(&b.Queued, &b.QueuedUnits, &b.Oldest, &b.Sending, &b.Customers)
	if err != nil {
		return b, fmt.Errorf("reading the meter backlog of %s: %w", stream, err)
	}
	return b, nil
}
