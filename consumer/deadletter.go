package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// DeadLetterStream is where entries that must not be charged go, with the
// reason: <stream>:dead.
func DeadLetterStream(stream string) string { return stream + ":dead" }

// DeadLetter copies an entry to the dead-letter stream with the original
// fields plus reason, detail, source_id, group and consumer, then acks it.
// Nothing is lost: if the XADD fails the entry stays pending. If the process
// dies between XADD and XACK, the redelivery writes a second dead letter with
// the same source_id (harmless, and visible).
func DeadLetter(ctx context.Context, rdb redis.UniversalClient, stream, group, consumer string, msg redis.XMessage, reason, detail string, now time.Time) error {
	return DeadLetterMany(ctx, rdb, stream, group, consumer, []Dead{{Msg: msg, Reason: reason, Detail: detail}}, now)[0]
}

// Dead is one entry for DeadLetterMany.
type Dead struct {
	Msg            redis.XMessage
	Reason, Detail string
	// Alerted: an alert of its own announced this event (spend_cap,
	// meter_event_parked, meter_missing, permission_denied, …), so the
	// dead_letters alert leaves it out: one event, one Slack message.
	Alerted bool
}

// DeadLetterMany is DeadLetter for several entries of one stream in two
// round trips: the XADDs pipelined, then one XACK of those written. The
// error for each entry is at its index (nil: dead-lettered and acked); an
// entry whose XADD failed is not acked.
func DeadLetterMany(ctx context.Context, rdb redis.UniversalClient, stream, group, consumer string, dead []Dead, now time.Time) []error {
	ctx, cancel := detach(ctx)
	defer cancel()
	errs := make([]error, len(dead))
	pipe := rdb.Pipeline()
	adds := make([]*redis.StringCmd, len(dead))
	at := now.UTC().Format(time.RFC3339Nano)
	for i, d := range dead {
		values := make(map[string]any, len(d.Msg.Values)+7)
		for k, v := range d.Msg.Values {
			values[k] = v
		}
		values["reason"] = d.Reason
		values["detail"] = truncate(d.Detail, 1000)
		values["source_id"] = d.Msg.ID
		values["source_stream"] = stream
		values["group"] = group
		values["consumer"] = consumer
		values["dead_at"] = at
		adds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: DeadLetterStream(stream), Values: values})
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var ids []string
	for i, c := range adds {
		if err := c.Err(); err != nil {
			errs[i] = fmt.Errorf("writing dead letter for %s: %w", dead[i].Msg.ID, err)
			continue
		}
		ids = append(ids, dead[i].Msg.ID)
	}
	if len(ids) == 0 {
		return errs
	}
	if err := rdb.XAck(ctx, stream, group, ids...).Err(); err != nil {
		for i := range dead {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("XACK %s after dead-lettering: %w", dead[i].Msg.ID, err)
			}
		}
	}
	return errs
}

// deadLetter parks a held entry in <stream>:dead with the reason and acks
// it. A ledger-driven retry's hold (no stream) has no entry to park: its
// alert and its ledger row are the record.
// alerted says an alert of its own announced the event: the dead_letters
// alert leaves it out (one event, one Slack message).
func (p *Processor) deadLetter(ctx context.Context, stream string, msg redis.XMessage, reason, detail string, out Outcome, alerted bool) (Outcome, error) {
	if stream == "" {
		return out, nil
	}
	p.hb.acking(stream, msg.ID)
	trace.SpanFromContext(ctx).SetAttributes(attrDeadLetterReason.String(reason))
	if err := p.cfg.Witness.Mirror(ctx); err != nil {
		return OutcomeRetryLater, err // the ledger write before it is not witnessed yet
	}
	if err := DeadLetter(ctx, p.cfg.Redis, stream, p.cfg.Group, p.cfg.Name, msg, reason, detail, p.cfg.Clock.Now()); err != nil {
		return OutcomeRetryLater, err
	}
	p.cfg.Metrics.deadLetter(stream, reason)
	if p.cfg.DeadLetters != nil && !alerted {
		p.cfg.DeadLetters.Add(stream, reason, msg.ID, CustomerOf(msg))
	}
	return out, nil
}

// CustomerOf extracts customer_id (a meter event's stripe_customer_id when
// it has no customer_id) for alert examples without trusting the body.
func CustomerOf(msg redis.XMessage) string {
	if c := fieldOf(msg, `"customer_id":"`); c != "" {
		return c
	}
	return fieldOf(msg, `"stripe_customer_id":"`)
}

func fieldOf(msg redis.XMessage, k string) string {
	if s, ok := msg.Values["payload"].(string); ok {
		for i := 0; i+len(k) < len(s); i++ {
			if s[i:i+len(k)] == k {
				j := i + len(k)
				end := j
				for end < len(s) && s[end] != '"' && end-j < 64 {
					end++
				}
				return s[j:end]
			}
		}
	}
	return ""
}

// ReplayedFromField marks an entry ReplayDeadLetters put back: its value is
// the dead letter's id. A replay is the runbook's "fix, then replay": it
// charges a row whose last attempt failed finally (failed,
// action_required) again under the next attempt's key, where any other
// delivery of a finished row is acked without a call.
const ReplayedFromField = "replayed_from"

// deadLetterMeta are the fields DeadLetter adds; a replay strips them.
var deadLetterMeta = []string{"reason", "detail", "source_id", "source_stream", "group", "consumer", "dead_at", ReplayedFromField,
	ReplayOverrideField}

// ReplayOverrideField carries, on a replayed meter event, the operator's
// override (who, when, why): an event Stripe may have counted is sent
// again past the safe window of its first attempt only with it. A replay
// strips it, so it never outlives the one replay it was given for.
const ReplayOverrideField = "replay_override"

// Replayed is one dead letter put back on its stream.
type Replayed struct {
	DeadID, NewID, SourceID, Reason string
}

// ReplayDeadLetters puts dead letters of stream whose reason matches (all
// when reason is "") back on the stream with their original fields, oldest
// first, at most limit (0: no limit), and deletes them from the dead-letter
// stream. With dryRun it only lists them. It is how events parked for
// spend_cap, no_spend_cap or stripe_key_error are billed once the cause is
// fixed. A crash between the XADD and the XDEL leaves the event both
// replayed and parked; a second replay adds it again, which the ledger
// absorbs (already billed → acked, no second charge).
func ReplayDeadLetters(ctx context.Context, rdb redis.UniversalClient, stream, reason string, limit int, dryRun bool) ([]Replayed, error) {
	return ReplayDeadLettersOverride(ctx, rdb, stream, reason, limit, dryRun, "")
}

// ReplayDeadLettersOverride is ReplayDeadLetters with an operator's
// override (who, when, why; empty: none) written on each replayed entry
// (ReplayOverrideField).
func ReplayDeadLettersOverride(ctx context.Context, rdb redis.UniversalClient, stream, reason string, limit int, dryRun bool, override string) ([]Replayed, error) {
	var out []Replayed
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, DeadLetterStream(stream), start, "+", 100).Result()
		if err != nil {
			return out, fmt.Errorf("reading %s: %w", DeadLetterStream(stream), err)
		}
		for _, m := range msgs {
			r, _ := m.Values["reason"].(string)
			if reason != "" && r != reason {
				continue
			}
			if limit > 0 && len(out) >= limit {
				return out, nil
			}
			rep := Replayed{DeadID: m.ID, Reason: r}
			rep.SourceID, _ = m.Values["source_id"].(string)
			if !dryRun {
				values := make(map[string]any, len(m.Values))
				for k, v := range m.Values {
					values[k] = v
				}
				for _, k := range deadLetterMeta {
					delete(values, k)
				}
				values[ReplayedFromField] = m.ID
				if override != "" {
					values[ReplayOverrideField] = override
				}
				id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Result()
				if err != nil {
					return out, fmt.Errorf("replaying %s onto %s: %w", m.ID, stream, err)
				}
				rep.NewID = id
				if err := rdb.XDel(ctx, DeadLetterStream(stream), m.ID).Err(); err != nil {
					return out, fmt.Errorf("removing replayed dead letter %s: %w", m.ID, err)
				}
			}
			out = append(out, rep)
		}
		if len(msgs) < 100 {
			return out, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}
