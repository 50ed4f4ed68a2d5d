// Package watermark reads a consumer group's ingest watermark: the stream
// position below which every entry has been read by the group and acked.
//
// The meter consumer acks an entry only after its event is committed to the
// ledger (write before ack), so an entry id below the watermark is in the
// ledger (or dead-lettered): a per-second aggregate whose arrival second
// ends at or below the watermark has every member it will ever have
// (DESIGN.md "Usage at volume").
package watermark

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mark is a group's ingest watermark.
type Mark struct {
	// MS: every entry whose id's milliseconds are below MS was delivered to
	// the group and acked. It is the lowest pending entry's milliseconds,
	// or those of the entry after the last delivered one, whichever is
	// lower; with everything read and nothing pending it is the server's
	// TIME (an entry added later gets an id at or above it).
	MS int64
	// Pending and Unread say what holds the mark back (neither: TIME).
	Pending, Unread bool
}

// Time is the watermark as a time.
func (m Mark) Time() time.Time { return time.UnixMilli(m.MS).UTC() }

// Passed reports whether the second starting at unix second s has ended
// below the watermark: every entry that arrived in it or before is acked.
func (m Mark) Passed(s int64) bool { return (s+1)*1000 <= m.MS }

// Read reads group's watermark on stream in one MULTI (XINFO STREAM for the
// last generated id, XINFO GROUPS for the group's last delivered id, the
// XPENDING summary and TIME), so the four describe one instant.
func Read(ctx context.Context, rdb redis.UniversalClient, stream, group string) (Mark, error) {
	var info *redis.XInfoStreamCmd
	var groups *redis.XInfoGroupsCmd
	var pending *redis.XPendingCmd
	var now *redis.TimeCmd
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		info = p.XInfoStream(ctx, stream)
		groups = p.XInfoGroups(ctx, stream)
		pending = p.XPending(ctx, stream, group)
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		return Mark{}, fmt.Errorf("reading the ingest watermark of %s/%s: %w", stream, group, err)
	}
	var delivered string
	found := false
	for _, g := range groups.Val() {
		if g.Name == group {
			delivered, found = g.LastDeliveredID, true
		}
	}
	if !found {
		return Mark{}, fmt.Errorf("reading the ingest watermark of %s: no consumer group %s", stream, group)
	}
	return mark(info.Val().LastGeneratedID, delivered, pending.Val(), now.Val())
}

// mark computes the watermark from what Read read.
func mark(lastGenerated, lastDelivered string, p *redis.XPending, now time.Time) (Mark, error) {
	gen, err := parseID(lastGenerated)
	if err != nil {
		return Mark{}, err
	}
	del, err := parseID(lastDelivered)
	if err != nil {
		return Mark{}, err
	}
	m := Mark{MS: now.UnixMilli()}
	if less(del, gen) {
		// Unread entries follow the last delivered one: the first of them
		// may share its millisecond.
		m.MS, m.Unread = min(m.MS, del[0]), true
	}
	if p != nil && p.Count > 0 {
		low, err := parseID(p.Lower)
		if err != nil {
			return Mark{}, err
		}
		m.MS, m.Pending = min(m.MS, low[0]), true
	}
	return m, nil
}

func less(a, b [2]int64) bool { return a[0] < b[0] || a[0] == b[0] && a[1] < b[1] }

// ArrivalSecond is the unix second an entry id was generated in (its
// milliseconds / 1000).
func ArrivalSecond(id string) (int64, error) {
	v, err := parseID(id)
	return v[0] / 1000, err
}

var errID = errors.New("not a stream entry id")

func parseID(id string) ([2]int64, error) {
	ms, seq, ok := strings.Cut(id, "-")
	a, err1 := strconv.ParseInt(ms, 10, 64)
	b, err2 := strconv.ParseInt(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil || a < 0 || b < 0 {
		return [2]int64{}, fmt.Errorf("%w: %q", errID, id)
	}
	return [2]int64{a, b}, nil
}
