package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
)

// The usage repair (DESIGN.md "Usage after a ledger rollback"). Stripe has
// no listing of single meter events, so unlike charges the lost rows cannot
// be read back from Stripe: they are restored from the meter witness
// (internal/meterwitness), which holds every event acked delivered or
// parked, written before its XACK. What the witness cannot vouch for —
// entries of the meter streams not acked (pending, or unread after a Redis
// rollback took the group back) whose row is missing — is decided by age:
// younger than the safe window, the consumers send it again under its
// identifier (Stripe refuses a duplicate: recorded delivered); older, it
// may have been counted more than Stripe's identifier window ago, so it is
// parked, named in the report, and never re-sent.

// UsageConfig configures a usage repair.
type UsageConfig struct {
	Ledger *meterledger.Ledger   // required
	Redis  redis.UniversalClient // required: the witness and the streams
	Since  time.Time             // required: where the ledger's loss may begin
	// Until is when the loss was found (the rollback's detection): the
	// ledger took writes elsewhere by then, so an entry added to a stream
	// after it was never sent before the loss. Such entries are sent as
	// usual and counted apart (UsageReport.New). Zero: every entry not
	// acked may have been sent before the loss.
	Until  time.Time
	By     string           // who repairs, for the notes
	Logger *slog.Logger     // optional
	Rules  event.MeterRules // how the streams' entries are read (the consumers' rules)
}

// UsageReport is what a usage repair did.
type UsageReport struct {
	// Restored: rows the ledger lost, inserted again from the witness;
	// Repaired: rows the rollback took back to sending, set to their
	// witnessed outcome.
	Restored, Repaired int
	// Parked: entries not acked whose row is missing and that are older
	// than the safe window: parked by the repair, never re-sent.
	Parked int
	// Resend: entries not acked whose row is missing, within the safe
	// window, added before the loss was found (they may have been sent
	// before it): the consumers send them again under their identifiers
	// (Stripe refuses one it has: recorded delivered).
	Resend int
	// New: entries not acked whose row is missing, added after the loss
	// was found (UsageConfig.Until): never sent before it; the consumers
	// send them as usual.
	New int
	// Findings: what it could not restore and names in Notes (a parked
	// event, a row that disagrees with the witness, a witness that does not
	// reach back to Since, members it could not read).
	Findings int
	Streams  int
	Notes    []string
}

// restoreBatch is how many events one Restore statement writes.
const restoreBatch = 500

// Usage repairs the meter ledger after a rollback: see the comment above.
// It is idempotent, and safe beside the consumers: a restore never makes an
// event sendable, and a parked row is one they ack.
func Usage(ctx context.Context, cfg UsageConfig) (UsageReport, error) {
	var rep UsageReport
	if cfg.Ledger == nil || cfg.Redis == nil || cfg.Since.IsZero() {
		return rep, errors.New("repair: the usage repair needs the meter ledger, Redis and Since")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.By = cmp.Or(cfg.By, "repair")
	u := &usage{cfg: cfg, rep: &rep, log: cfg.Logger.With("by", cfg.By)}
	err := u.do(ctx)
	if u.omitted > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("… and %d more such meter event lines (see the logs)", u.omitted))
	}
	if rep.Streams > 0 || err != nil {
		// First: the rollback's report keeps its first 4,000 characters.
		rep.Notes = append([]string{fmt.Sprintf("%s repaired the usage of %d meter streams since %s: %d meter event rows restored from the witness, "+
			"%d set back to their witnessed outcome, %d parked (not acked, past the safe window: never re-sent), %d left to be sent again "+
			"under their identifiers (their entries may have been sent before the loss)%s, %d findings", cfg.By, rep.Streams,
			cfg.Since.UTC().Format(time.RFC3339), rep.Restored, rep.Repaired, rep.Parked, rep.Resend, newNote(rep.New), rep.Findings)}, rep.Notes...)
	}
	return rep, err
}

// newNote says how many entries added after the loss was found are
// still to be sent (never sent before it); nothing when there are none.
func newNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d added after the loss was found and never sent before it (sent as usual)", n)
}

type usage struct {
	cfg     UsageConfig
	rep     *UsageReport
	log     *slog.Logger
	details int
	omitted int
}

func (u *usage) note(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	u.log.Info(line)
	if u.details++; u.details > maxDetailNotes {
		u.omitted++
		return
	}
	u.rep.Notes = append(u.rep.Notes, line)
}

func (u *usage) do(ctx context.Context) error {
	id, err := u.cfg.Ledger.LedgerID(ctx)
	if err != nil {
		return err
	}
	streams, err := meterwitness.Streams(ctx, u.cfg.Redis, id)
	if err != nil || len(streams) == 0 {
		return err
	}
	now := u.cfg.Ledger.Now()
	if _, err := u.cfg.Ledger.EnsurePartitions(ctx, now); err != nil {
		return err
	}
	u.rep.Streams = len(streams)
	// Every witness first: an event witnessed delivered is never parked.
	for _, s := range streams {
		if err := u.restore(ctx, s, now); err != nil {
			return err
		}
	}
	for _, s := range streams {
		if err := u.unacked(ctx, s, now); err != nil {
			return err
		}
	}
	return nil
}

// restore writes back what s's witness holds since Since.
func (u *usage) restore(ctx context.Context, s meterwitness.Stream, now time.Time) error {
	sent, pruned, bad, err := meterwitness.Read(ctx, u.cfg.Redis, s, u.cfg.Since)
	if err != nil {
		return err
	}
	if pruned.After(u.cfg.Since) {
		u.rep.Findings++
		u.note("%s/%s: the meter witness reaches back to %s only, the loss to %s: delivered rows lost in between cannot be restored; "+
			"compare Stripe's event summaries of that window with the ledger (pelguard-auditor usage)", s.Stream, s.Group,
			pruned.Format(time.RFC3339), u.cfg.Since.UTC().Format(time.RFC3339))
	}
	if bad > 0 {
		u.rep.Findings++
		u.note("%s/%s: %d meter witness members could not be read: not restored", s.Stream, s.Group, bad)
	}
	oldest := now.Add(-meterledger.Retention)
	// A delivered witness wins over a parked one of the same event.
	byKey := map[meterledger.Key]int{}
	var evs []meterledger.Restored
	// Aggregates witnessed before their first call: their members are
	// restored under them, never sent on their own (twice counted).
	memberOf := map[string]meterwitness.Sent{}
	var aggs []meterwitness.Sent
	for _, e := range sent {
		if e.Status == meterwitness.Aggregate {
			aggs = append(aggs, e)
			for _, m := range e.Members {
				memberOf[m] = e
			}
		}
	}
	for _, e := range sent {
		if e.Status == meterwitness.Aggregate {
			continue
		}
		k := meterledger.Key{EventTS: e.EventTS.UTC().Truncate(time.Millisecond), Identifier: e.Identifier}
		if !k.EventTS.After(oldest) {
			continue // its partition is gone: Stripe no longer takes or changes it
		}
		r := meterledger.Restored{Key: k, EventName: e.EventName, StripeCustomerID: e.StripeCustomerID, CustomerID: e.CustomerID,
			Value: e.Value, Status: meterledger.Status(e.Status), FirstSentAt: e.FirstSentAt, Reason: e.Reason, MessageID: e.MessageID}
		if r.Status == meterledger.StatusParked && r.Reason == "" {
			r.Reason = "parked before the ledger's rollback (restored from the meter witness)"
		}
		if r.Status == meterledger.StatusQueued {
			// Ingested and acked: restored queued, of unknown outcome since
			// its ingest (no attempt is older), for its stream's senders; a
			// member of a witnessed aggregate, sending under it. An aggregate
			// meter's row restored sending with no aggregate would be sent on
			// its own beside the aggregate both stores lost, and its bucket
			// formed again without it under another identifier: both counted
			// twice.
			r.FirstSentAt, r.Stream = e.At, s.Stream
			if !e.FirstSentAt.IsZero() && e.FirstSentAt.Before(e.At) {
				r.FirstSentAt = e.FirstSentAt
			}
			if g, ok := memberOf[e.Identifier]; ok {
				r.Aggregate = g.Identifier
			}
		}
		if i, ok := byKey[k]; ok {
			// delivered wins over parked, and both over queued.
			if r.Status == meterledger.StatusDelivered || r.Status == meterledger.StatusParked && evs[i].Status == meterledger.StatusQueued {
				evs[i] = r
			}
			continue
		}
		byKey[k] = len(evs)
		evs = append(evs, r)
	}
	for start := 0; start < len(evs); start += restoreBatch {
		part := evs[start:min(start+restoreBatch, len(evs))]
		res, err := u.cfg.Ledger.Restore(ctx, part, true)
		if err != nil {
			return err
		}
		for i, r := range res {
			switch r.Outcome {
			case meterledger.RestoreInserted:
				u.rep.Restored++
			case meterledger.RestoreRepaired:
				u.rep.Repaired++
			case meterledger.RestoreConflict:
				u.rep.Findings++
				u.note("%s/%s: meter event %s: %s", s.Stream, s.Group, part[i].Key, r.Detail)
			}
		}
	}
	safe := u.cfg.Ledger.SafeWindow()
	for _, g := range aggs {
		ok, err := u.cfg.Ledger.RestoreAggregate(ctx, meterledger.Aggregate{Identifier: g.Identifier, Stream: s.Stream,
			EventName: g.EventName, StripeCustomerID: g.StripeCustomerID, Second: g.EventTS, Value: g.Value, Members: len(g.Members),
			Digest: g.Digest, FirstSentAt: g.FirstSentAt})
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		u.rep.Restored++
		if now.Sub(g.FirstSentAt) >= safe {
			// Its outcome is what the repair cannot restore: Stripe may
			// have counted it, and no longer guards its identifier.
			u.rep.Findings++
			u.note("%s/%s: meter aggregate %s (%s/%s, %d events, sum %d, first sent %s) was in flight when the ledger lost it: "+
				"its outcome is unknown and past the safe window, so the senders park it with its members, never re-sent; "+
				"compare Stripe's event summaries of that second", s.Stream, s.Group, g.Identifier, g.EventName, g.StripeCustomerID,
				len(g.Members), g.Value, g.FirstSentAt.UTC().Format(time.RFC3339))
		}
	}
	u.log.Info("meter events restored from the witness", "stream", s.Stream, "group", s.Group, "witnessed", len(evs),
		"restored", u.rep.Restored, "repaired", u.rep.Repaired)
	return nil
}

// unacked decides the entries of s not acked whose row is missing: parked
// past the safe window, left to the consumers within it.
func (u *usage) unacked(ctx context.Context, s meterwitness.Stream, now time.Time) error {
	rdb := u.cfg.Redis
	// The group's last delivered id first, its pending entries next: an
	// entry a consumer reads in between is then in the pending list (read
	// after it) as well as past the id, never in neither. Read the other
	// way round, it would be in neither, would not be parked, and once
	// the rollback is repaired its consumer would send it again.
	groups, err := rdb.XInfoGroups(ctx, s.Stream).Result()
	if err != nil && !redis.HasErrorPrefix(err, "no such key") {
		return fmt.Errorf("reading the groups of %s: %w", s.Stream, err)
	}
	lastDelivered := ""
	for _, g := range groups {
		if g.Name == s.Group {
			lastDelivered = g.LastDeliveredID
		}
	}
	if lastDelivered == "" {
		return nil // no such stream or group: nothing was read from it
	}
	var ids []string
	for start := "-"; ; {
		pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.Stream, Group: s.Group, Start: start, End: "+", Count: 1000}).Result()
		if redis.HasErrorPrefix(err, "NOGROUP") {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the pending entries of %s/%s: %w", s.Stream, s.Group, err)
		}
		for _, p := range pend {
			ids = append(ids, p.ID)
		}
		if len(pend) < 1000 {
			break
		}
		start = "(" + pend[len(pend)-1].ID
	}
	var msgs []redis.XMessage
	seen := map[string]bool{}
	if len(ids) > 0 {
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range ids {
				p.XRange(ctx, s.Stream, id, id)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("reading the pending entries of %s/%s: %w", s.Stream, s.Group, err)
		}
		for _, c := range cmds {
			if xs, err := c.(*redis.XMessageSliceCmd).Result(); err == nil {
				for _, x := range xs {
					seen[x.ID] = true
					msgs = append(msgs, x)
				}
			}
		}
	}
	// Unread: after the group's last delivered id (a Redis rollback takes
	// it back), up to now: an entry added later was never sent before.
	// Entry ids are Redis's wall clock, so the bound is too.
	end := fmt.Sprintf("%d", time.Now().UnixMilli())
	for start := "(" + lastDelivered; ; {
		xs, err := rdb.XRangeN(ctx, s.Stream, start, end, 1000).Result()
		if err != nil {
			return fmt.Errorf("reading the unread entries of %s/%s: %w", s.Stream, s.Group, err)
		}
		for _, x := range xs {
			if !seen[x.ID] {
				msgs = append(msgs, x)
			}
		}
		if len(xs) < 1000 {
			break
		}
		start = "(" + xs[len(xs)-1].ID
	}
	return u.decideUnacked(ctx, s, msgs, now)
}

func (u *usage) decideUnacked(ctx context.Context, s meterwitness.Stream, msgs []redis.XMessage, now time.Time) error {
	safe := u.cfg.Ledger.SafeWindow()
	for start := 0; start < len(msgs); start += restoreBatch {
		part := msgs[start:min(start+restoreBatch, len(msgs))]
		var keys []meterledger.Key
		var evs []meterledger.Restored
		for _, m := range part {
			ev, err := event.ParseMeterFields(m.Values, u.cfg.Rules, now)
			if err != nil {
				continue // the consumers dead-letter it: it was never sent
			}
			k := meterledger.KeyOf(ev, ev.Identifier(s.Namespace))
			keys = append(keys, k)
			// Its first attempt is unknown: taken as the event's own time
			// (what parks it below), so that a replay is refused until a
			// person settles it (meterledger decideRow), never sent while
			// Stripe may count it.
			evs = append(evs, meterledger.Restored{Key: k, EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID,
				CustomerID: ev.CustomerID, Value: ev.Value, Status: meterledger.StatusParked, MessageID: m.ID, FirstSentAt: ev.Timestamp,
				Reason: fmt.Sprintf("the ledger lost rows in a rollback (from %s) and this entry was not acked: it may have been counted "+
					"by Stripe more than its identifier window ago, so it is not re-sent. If Stripe's event summaries lack it, settle it "+
					"as not counted (%s meter-settle), then replay it", u.cfg.Since.UTC().Format(time.RFC3339), cmdname.Consumer)})
		}
		_, found, err := u.cfg.Ledger.Lookup(ctx, keys)
		if err != nil {
			return err
		}
		var park []meterledger.Restored
		for i, e := range evs {
			switch {
			case found[i]:
				// The ledger knows it: the consumers decide it as usual.
			case now.Sub(e.EventTS) < safe && addedAfter(e.MessageID, u.cfg.Until):
				// Added once the ledger took writes elsewhere: never sent
				// before the loss; the consumers send it as usual.
				u.rep.New++
			case now.Sub(e.EventTS) < safe:
				u.rep.Resend++
			default:
				park = append(park, e)
			}
		}
		res, err := u.cfg.Ledger.Restore(ctx, park, false)
		if err != nil {
			return err
		}
		for i, r := range res {
			if r.Outcome != meterledger.RestoreInserted {
				continue
			}
			u.rep.Parked++
			u.rep.Findings++
			e := park[i]
			u.note("%s/%s: meter event %s (entry %s, %s/%s value %d, %s old) parked: not acked when the ledger lost rows, past the safe window; never re-sent",
				s.Stream, s.Group, e.Identifier, e.MessageID, e.EventName, e.StripeCustomerID, e.Value,
				now.Sub(e.EventTS).Round(time.Minute))
		}
	}
	if n := u.rep.Resend; n > 0 {
		u.log.Info("meter events left to be sent again under their identifiers", "stream", s.Stream, "group", s.Group, "events", n)
	}
	return nil
}

// addedAfter reports whether the stream entry id (Redis's clock in
// milliseconds, a dash, a sequence) was added after until; false when
// until is zero or the id does not parse.
func addedAfter(id string, until time.Time) bool {
	if until.IsZero() {
		return false
	}
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	return ok && err == nil && n > until.UnixMilli()
}
