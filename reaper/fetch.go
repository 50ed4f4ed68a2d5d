package reaper

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
)

// entry is one pending entry of a page on its way through fetch, decide and
// act.
type entry struct {
	pe     redis.XPendingExt
	msg    redis.XMessage
	gone   bool
	rowKey ledger.Key // the key the ledger was asked about; zero when none could be read
	v      verdict
	// ownerUnknown: the owner is not a registered pelguard consumer.
	ownerUnknown bool
}

// pageRows are the ledger rows fetched for a page's entries.
type pageRows map[ledger.Key]ledger.Record

// input is what decideEntry needs to know about e.
func (e *entry) input(rows pageRows, now time.Time) decideInput {
	in := decideInput{Pending: e.pe, Gone: e.gone, Fields: e.msg.Values, RowKey: e.rowKey, Now: now, OwnerUnknown: e.ownerUnknown}
	in.Row, in.HasRow = rows[e.rowKey]
	return in
}

// fetch reads what decideEntry needs for entries: their bodies, and the
// ledger rows of the keys their payloads name, in one query. The ledger is
// asked by the key fields alone (event.QuickKey) so that an already billed
// entry, the bulk of a large PEL, is recognised without a full parse; when
// the quick reading was wrong, decideEntry asks for the right row
// (refetchRows).
func (r *Reaper) fetch(ctx context.Context, st *streamState, entries []*entry) (pageRows, error) {
	bodies, err := r.bodies(ctx, st, entries)
	if err != nil {
		return nil, err
	}
	keys := make([]ledger.Key, 0, len(entries))
	for _, e := range entries {
		msg, ok := bodies[e.pe.ID]
		if !ok {
			e.gone = true
			continue
		}
		e.msg = msg
		if k, ok := quickKey(msg); ok {
			e.rowKey = k
			keys = append(keys, k)
		}
	}
	rows, err := r.lookupRows(ctx, keys)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// refetchRows looks up, in one query, the keys decideEntry asked for
// (verdict.NeedRow), adds them to rows and points each entry at its key.
func (r *Reaper) refetchRows(ctx context.Context, entries []*entry, rows pageRows) error {
	keys := make([]ledger.Key, len(entries))
	for i, e := range entries {
		keys[i] = e.v.Lookup
	}
	extra, err := r.lookupRows(ctx, keys)
	if err != nil {
		return err
	}
	maps.Copy(rows, extra)
	for _, e := range entries {
		e.rowKey = e.v.Lookup
	}
	return nil
}

// quickKey is event.QuickKey as a ledger key.
func quickKey(msg redis.XMessage) (ledger.Key, bool) {
	cust, period, ok := event.QuickKey(msg.Values)
	return ledger.Key{CustomerID: cust, BillingPeriod: period}, ok
}

// bodies fetches the page's entries. An abandoned batch is usually a run
// of consecutive stream entries, so one XRANGE over the page's id span
// (bounded to twice the page) usually returns them all; whatever that read
// did not cover is fetched with pipelined XRANGE id id. An entry inside the
// covered span that did not come back was deleted or trimmed.
func (r *Reaper) bodies(ctx context.Context, st *streamState, entries []*entry) (map[string]redis.XMessage, error) {
	out := make(map[string]redis.XMessage, len(entries))
	first, last := entries[0].pe.ID, entries[len(entries)-1].pe.ID
	limit := int64(2 * len(entries))
	span, err := r.cfg.Redis.XRangeN(ctx, st.Stream, first, last, limit).Result()
	if err != nil {
		return nil, fmt.Errorf("fetching bodies %s..%s: %w", first, last, err)
	}
	wanted := make(map[string]bool, len(entries))
	for _, e := range entries {
		wanted[e.pe.ID] = true
	}
	for _, m := range span {
		if wanted[m.ID] {
			out[m.ID] = m
		}
	}
	if int64(len(span)) < limit {
		return out, nil // the whole span was read
	}
	covered := span[len(span)-1].ID
	var rest []string
	for _, e := range entries {
		if _, ok := out[e.pe.ID]; !ok && compareIDs(e.pe.ID, covered) > 0 {
			rest = append(rest, e.pe.ID)
		}
	}
	pipe := r.cfg.Redis.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(rest))
	for i, id := range rest {
		cmds[i] = pipe.XRange(ctx, st.Stream, id, id)
	}
	if len(rest) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("fetching %d bodies: %w", len(rest), err)
		}
	}
	for _, c := range cmds {
		if msgs := c.Val(); len(msgs) == 1 {
			out[msgs[0].ID] = msgs[0]
		}
	}
	return out, nil
}

// compareIDs orders stream ids ("ms-seq") numerically.
func compareIDs(a, b string) int {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if c := cmp.Compare(an, bn); c != 0 {
		return c
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return cmp.Compare(asq, bsq)
}
