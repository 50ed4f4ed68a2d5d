package streamfacts

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/pg"
)

// sample checks c.Namespace against the ledger's rows of the stream's
// kind: sampled rows could be checked, matched were made under it, def
// under DefaultNamespace (counted only when c.Namespace is another).
//
// The ledger does not say which stream a row came from: a schema shared by
// streams of several namespaces would have rows that match none, so the
// check refuses only when no checked row matches.
func (c Check) sample(ctx context.Context, db pg.DB, s Stream) (sampled, matched, def int, err error) {
	if s.Kind == Usage {
		return c.sampleUsage(ctx, db, s)
	}
	// The key of a billing record is recomputable from its own columns: a
	// row keyed under another namespace cannot match.
	rs, err := db.Query(ctx, `SELECT customer_id, billing_period, idempotency_key FROM {schema}.billing_records LIMIT $1`, sampleSize)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("sampling billing_records: %w", err)
	}
	var cust, period, key string
	_, err = pgx.ForEachRow(rs, []any{&cust, &period, &key}, func() error {
		sampled++
		if event.IdempotencyKey(cust, period, c.Namespace) == key {
			matched++
		} else if c.Namespace != DefaultNamespace && event.IdempotencyKey(cust, period, DefaultNamespace) == key {
			def++
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("sampling billing_records: %w", err)
	}
	return sampled, matched, def, nil
}

type meterRow struct {
	ev         event.MeterEvent
	identifier string
	msgID      string
}

// sampleUsage recomputes the identifiers of the most recent meter events.
// A row holds everything of its event but the event_id: an event sent
// without one is checked from the row alone; one sent with one only when
// its stream entry is still there (and is the same event).
func (c Check) sampleUsage(ctx context.Context, db pg.DB, s Stream) (sampled, matched, def int, err error) {
	rs, err := db.Query(ctx, `SELECT event_ts, identifier, event_name, stripe_customer_id, value, coalesce(stream_message_id, '')
		FROM {schema}.meter_events ORDER BY event_ts DESC LIMIT $1`, sampleSize)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("sampling meter_events: %w", err)
	}
	var all []meterRow
	var r meterRow
	_, err = pgx.ForEachRow(rs, []any{&r.ev.Timestamp, &r.identifier, &r.ev.EventName, &r.ev.StripeCustomerID, &r.ev.Value, &r.msgID}, func() error {
		all = append(all, r)
		return nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("sampling meter_events: %w", err)
	}
	count := func(e event.MeterEvent, id string) {
		sampled++
		if e.Identifier(c.Namespace) == id {
			matched++
		} else if c.Namespace != DefaultNamespace && e.Identifier(DefaultNamespace) == id {
			def++
		}
	}
	var withID []meterRow
	for _, r := range all {
		if r.ev.Identifier(c.Namespace) == r.identifier ||
			(c.Namespace != DefaultNamespace && r.ev.Identifier(DefaultNamespace) == r.identifier) {
			count(r.ev, r.identifier) // sent without an event_id
		} else if r.msgID != "" {
			withID = append(withID, r)
		}
	}
	if c.Redis == nil || len(withID) == 0 {
		return sampled, matched, def, nil
	}
	pipe := c.Redis.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(withID))
	for i, r := range withID {
		cmds[i] = pipe.XRange(ctx, s.Name, r.msgID, r.msgID)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, 0, fmt.Errorf("reading %s's entries of sampled meter events: %w", s.Name, err)
	}
	for i, r := range withID {
		msgs, err := cmds[i].Result()
		if err != nil || len(msgs) != 1 {
			continue // trimmed, or the row came from another stream
		}
		// The entry's age does not matter here: only its fields.
		e, err := event.ParseMeterFields(msgs[0].Values, event.MeterRules{}, r.ev.Timestamp)
		if err != nil || e.EventName != r.ev.EventName || e.StripeCustomerID != r.ev.StripeCustomerID ||
			!e.Timestamp.Equal(r.ev.Timestamp) || e.EventID == "" {
			continue // another stream's entry under the same id
		}
		count(e, r.identifier)
	}
	return sampled, matched, def, nil
}
