package meterledger

import (
	"context"
	"fmt"
	"time"
)

// MeterBacklog is one meter's events of a stream recorded at ingest and
// not yet sent (status queued).
type MeterBacklog struct {
	EventName string
	// Queued counts the meter's queued events, every customer together.
	Queued int64
	// Busiest is the most any one customer has queued on the meter: a
	// count meter's busy customer sends one event per call latency, so
	// its backlog is where a meter stops catching up.
	Busiest int64
	// Oldest is when the oldest queued event was recorded (created_at;
	// a replayed event keeps its first recording's time).
	Oldest time.Time
}

// BacklogByMeter is stream's unsent backlog per meter, the meters with
// nothing queued left out. It reads only queued rows (meter_events_queued_idx).
func (l *Ledger) BacklogByMeter(ctx context.Context, stream string) ([]MeterBacklog, error) {
	rows, err := l.pool.Query(ctx, `SELECT event_name, sum(n)::bigint, max(n), min(oldest) FROM (
			SELECT event_name, stripe_customer_id, count(*) AS n, min(created_at) AS oldest
			FROM {schema}.meter_events WHERE status = 'queued' AND stream = $1
			GROUP BY event_name, stripe_customer_id
		) c GROUP BY event_name ORDER BY event_name`, stream)
	if err != nil {
		return nil, fmt.Errorf("reading the unsent meter backlog of %s: %w", stream, err)
	}
	defer rows.Close()
	var out []MeterBacklog
	for rows.Next() {
		var b MeterBacklog
		if err := rows.Scan(&b.EventName, &b.Queued, &b.Busiest, &b.Oldest); err != nil {
			return nil, fmt.Errorf("reading the unsent meter backlog of %s: %w", stream, err)
		}
		b.Oldest = b.Oldest.UTC()
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the unsent meter backlog of %s: %w", stream, err)
	}
	return out, nil
}
