package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/reaper"
)

// streamStat is one stream's PEL and dead letters, from Redis (not from
// Prometheus counters).
type streamStat struct {
	Stream, Group string
	Pending       int64
	OldestID      string
	OldestIdle    time.Duration
	Consumers     int // members of the group
	Holding       int // members holding pending entries
	Dead          int64
	Error         string
	// Backlog: a meter stream's events recorded in the ledger and not yet
	// sent (queued) or in flight (sending): with --send-from-ledger the
	// entries are acked at ingest, so Pending no longer shows them.
	Backlog *streamBacklog
	Now     time.Time
}

// streamStats reads XPENDING's summary, the oldest entry's idle time (the
// first entry of the PEL) and XLEN of the dead letters, per stream.
func (s *Server) streamStats(ctx context.Context) []streamStat {
	out := make([]streamStat, 0, len(s.cfg.Streams))
	for _, st := range s.cfg.Streams {
		ss := streamStat{Stream: st.Name, Group: st.Group}
		sum, err := s.cfg.Redis.XPending(ctx, st.Name, st.Group).Result()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
			ss.Error = "no such stream or group"
		case err != nil:
			ss.Error = redact.String(err.Error())
		default:
			ss.Pending, ss.OldestID, ss.Holding = sum.Count, sum.Lower, len(sum.Consumers)
			// Every member of the group, not only those holding entries (XPENDING's count).
			if gs, err := s.cfg.Redis.XInfoGroups(ctx, st.Name).Result(); err == nil {
				for _, g := range gs {
					if g.Name == st.Group {
						ss.Consumers = int(g.Consumers)
					}
				}
			}
			if sum.Count > 0 {
				ext, err := s.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: st.Name, Group: st.Group,
					Start: "-", End: "+", Count: 1}).Result()
				if err == nil && len(ext) == 1 {
					ss.OldestIdle = ext[0].Idle
				}
			}
		}
		ss.Dead, _ = s.cfg.Redis.XLen(ctx, consumer.DeadLetterStream(st.Name)).Result()
		if st.Meter {
			if b, err := backlogOfStream(ctx, s.db, st.Name); err == nil {
				ss.Backlog, ss.Now = &b, s.now()
			}
		}
		out = append(out, ss)
	}
	return out
}

// streamLosses reads the losses the reaper recorded per stream (entries a
// group never read, pending entries acked with their bodies gone), newest
// first. A failed read is shown as a line, not a failed page.
func (s *Server) streamLosses(ctx context.Context) []reaper.LossRecord {
	var out []reaper.LossRecord
	for _, st := range s.cfg.Streams {
		ls, err := reaper.Losses(ctx, s.cfg.Redis, st.Name)
		if err != nil {
			out = append(out, reaper.LossRecord{StreamLoss: alerts.StreamLoss{Stream: st.Name, Count: -1,
				After: "unreadable: " + redact.String(err.Error())}})
			continue
		}
		out = append(out, ls...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seen.After(out[j].Seen) })
	return out
}

// reasonCount is one dead-letter reason of one stream.
type reasonCount struct {
	Stream, Reason string
	N              int
}

// deadByReason counts each stream's dead letters by reason over at most
// DeadLetterScan of them (oldest first); truncated says the count stopped.
func (s *Server) deadByReason(ctx context.Context) ([]reasonCount, bool, error) {
	var out []reasonCount
	truncated := false
	for _, st := range s.cfg.Streams {
		counts := map[string]int{}
		n, err := s.scanDead(ctx, st.Name, "-", s.cfg.DeadLetterScan, func(m redis.XMessage) bool {
			r, _ := m.Values["reason"].(string)
			counts[r]++
			return true
		})
		if err != nil {
			return out, truncated, err
		}
		truncated = truncated || n >= s.cfg.DeadLetterScan
		for r, c := range counts {
			out = append(out, reasonCount{Stream: st.Name, Reason: r, N: c})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Stream != out[j].Stream {
			return out[i].Stream < out[j].Stream
		}
		return out[i].N > out[j].N
	})
	return out, truncated, nil
}

// scanDead reads <stream>:dead from start (exclusive when it begins with
// "("), at most limit entries, calling fn until it returns false; it
// returns how many it read.
func (s *Server) scanDead(ctx context.Context, stream, start string, limit int, fn func(redis.XMessage) bool) (int, error) {
	read := 0
	for read < limit {
		want := min(1000, limit-read)
		msgs, err := s.cfg.Redis.XRangeN(ctx, consumer.DeadLetterStream(stream), start, "+", int64(want)).Result()
		if err != nil {
			return read, fmt.Errorf("reading %s: %w", consumer.DeadLetterStream(stream), err)
		}
		for _, m := range msgs {
			read++
			if !fn(m) {
				return read, nil
			}
		}
		if len(msgs) < want {
			return read, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	return read, nil
}

// deadLetter is one dead letter as a page shows it: the event's business
// fields, and the rest redacted (no key, token or card number reaches a
// page whatever a producer put in the payload).
type deadLetter struct {
	ID, Stream, Reason, Detail, SourceID, DeadAt string
	CustomerID, Period, Amount                   string
	Payload                                      string
}

func toDeadLetter(stream string, m redis.XMessage) deadLetter {
	str := func(k string) string { v, _ := m.Values[k].(string); return v }
	d := deadLetter{ID: m.ID, Stream: stream, Reason: str("reason"), Detail: redact.String(truncate(str("detail"), 300)),
		SourceID: str("source_id"), DeadAt: str("dead_at")}
	raw := str("payload")
	var ev struct {
		CustomerID    string          `json:"customer_id"`
		BillingPeriod string          `json:"billing_period"`
		AmountCents   json.RawMessage `json:"amount_cents"`
		Currency      string          `json:"currency"`
	}
	if json.Unmarshal([]byte(raw), &ev) == nil {
		d.CustomerID, d.Period = truncate(ev.CustomerID, 64), truncate(ev.BillingPeriod, 32)
		if n, err := strconv.ParseInt(string(ev.AmountCents), 10, 64); err == nil {
			d.Amount = money(n, truncate(ev.Currency, 8))
		} else if len(ev.AmountCents) > 0 { // not whole minor units: why it is dead, shown as sent
			d.Amount = truncate(string(ev.AmountCents), 24) + " " + truncate(ev.Currency, 8)
		}
	}
	d.Payload = redact.String(truncate(raw, 400))
	return d
}

// deadPage is one page of a stream's dead letters of a reason (all when
// empty), after the entry id after ("" from the oldest).
func (s *Server) deadPage(ctx context.Context, stream, reason, after string) ([]deadLetter, string, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	var out []deadLetter
	next := ""
	_, err := s.scanDead(ctx, stream, start, s.cfg.DeadLetterScan, func(m redis.XMessage) bool {
		if r, _ := m.Values["reason"].(string); reason != "" && r != reason {
			return true
		}
		if len(out) == s.cfg.PageSize {
			next = out[len(out)-1].ID
			return false
		}
		out = append(out, toDeadLetter(stream, m))
		return true
	})
	return out, next, err
}

// entry is one stream entry of a customer, found by the ledger's message
// id (never by scanning the stream), with its PEL state.
type entry struct {
	Stream, ID, Payload string
	Found               bool
	Pending             bool
	Consumer            string
	Idle                time.Duration
	Deliveries          int64
}

func (s *Server) entriesOf(ctx context.Context, msgID string) []entry {
	var out []entry
	if msgID == "" {
		return nil
	}
	for _, st := range s.cfg.Streams {
		e := entry{Stream: st.Name, ID: msgID}
		msgs, err := s.cfg.Redis.XRangeN(ctx, st.Name, msgID, msgID, 1).Result()
		if err == nil && len(msgs) == 1 {
			e.Found = true
			p, _ := msgs[0].Values["payload"].(string)
			e.Payload = redact.String(truncate(p, 400))
		}
		pend, err := s.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: st.Name, Group: st.Group,
			Start: msgID, End: msgID, Count: 1}).Result()
		if err == nil && len(pend) == 1 {
			e.Pending, e.Consumer, e.Idle, e.Deliveries = true, pend[0].Consumer, pend[0].Idle, pend[0].RetryCount
		}
		if e.Found || e.Pending {
			out = append(out, e)
		}
	}
	return out
}

// stream returns the configured stream named name.
func (s *Server) stream(name string) (Stream, error) {
	for _, st := range s.cfg.Streams {
		if st.Name == name {
			return st, nil
		}
	}
	return Stream{}, errors.New("not a stream this console shows")
}

// deadOf is a customer's dead letters (of one period, or all when period
// is empty) on every stream, over at most DeadLetterScan of each stream's
// dead letters (oldest first) and PageSize in all; truncated says a scan
// stopped before the end.
func (s *Server) deadOf(ctx context.Context, customer, period string) ([]deadLetter, bool, error) {
	var out []deadLetter
	truncated := false
	for _, st := range s.cfg.Streams {
		n, err := s.scanDead(ctx, st.Name, "-", s.cfg.DeadLetterScan, func(m redis.XMessage) bool {
			// A payload without a backslash has no JSON escape: unless it
			// holds the customer id as written, it is another customer's,
			// and is not decoded.
			if raw, _ := m.Values["payload"].(string); !strings.Contains(raw, customer) && !strings.Contains(raw, `\`) {
				return true
			}
			if c, p := payloadKey(m); c == customer && (period == "" || p == period) {
				out = append(out, toDeadLetter(st.Name, m))
			}
			return len(out) < s.cfg.PageSize
		})
		if err != nil {
			return out, truncated, err
		}
		truncated = truncated || n >= s.cfg.DeadLetterScan
		if len(out) >= s.cfg.PageSize {
			return out, true, nil
		}
	}
	return out, truncated, nil
}
