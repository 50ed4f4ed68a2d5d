package meterledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// An aggregate's members are fixed by the stream: the queued events of one
// (timestamp second, arrival bucket), formed only once the watermark has
// passed the bucket. The same entries ingested again after a rollback of
// both stores — in another order, in other batches, beside a re-published
// copy with a later entry id — form the same aggregate under the same
// identifier; an event that arrived later forms another. An event queued
// into a bucket already formed (a late join) is sent as another aggregate.
func TestAggregateMembersAreFixedByTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sec := t0.Add(-time.Minute)
	s := sec.Unix()
	id := func(arrivedMS int64, seq int) string { return fmt.Sprintf("%d-%d", arrivedMS, seq) }
	first := []meterledger.IngestRequest{
		ingestReq(mev("cus_a", "tokens", 2, sec), id((s+5)*1000, 0)),
		ingestReq(mev("cus_a", "tokens", 5, sec.Add(300*time.Millisecond)), id((s+5)*1000+700, 0)),
	}
	later := ingestReq(mev("cus_a", "tokens", 11, sec.Add(500*time.Millisecond)), id((s+6)*1000+200, 0))
	form := func(watermark time.Time) (meterledger.Aggregate, []meterledger.Record, bool) {
		t.Helper()
		a, ms, ok, err := b.l.FormAggregate(ctx, "test", "usage", "tokens", "cus_a", watermark, time.Second, "c", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if res, err := b.l.FinishAggregate(ctx, a, meterledger.Delivered, ""); err != nil || res != meterledger.Delivered {
				t.Fatalf("finishing %s: %v %v", a.Identifier, res, err)
			}
		}
		return a, ms, ok
	}
	b.ingest(t, first...)
	b.ingest(t, later)
	if _, _, ok := form(time.Unix(s+5, 999e6)); ok {
		t.Fatal("formed before the watermark passed the bucket's end")
	}
	a1, ms, ok := form(time.Unix(s+6, 0))
	if !ok || len(ms) != 2 || a1.Value != 7 || a1.ArrivalSecond != s+5 || !a1.Second.Equal(sec) {
		t.Fatalf("first bucket: ok %v, %d members, value %d, arrival %d (want 2, 7, %d)", ok, len(ms), a1.Value, a1.ArrivalSecond, s+5)
	}
	if _, _, ok := form(time.Unix(s+6, 999e6)); ok {
		t.Fatal("the later arrival's bucket formed before the watermark passed it")
	}
	a2, ms, ok := form(time.Unix(s+7, 0))
	if !ok || len(ms) != 1 || a2.Value != 11 || a2.ArrivalSecond != s+6 || a2.Identifier == a1.Identifier {
		t.Fatalf("the later arrival: ok %v, %d members, value %d, arrival %d, %s", ok, len(ms), a2.Value, a2.ArrivalSecond, a2.Identifier)
	}

	// A rollback of both stores loses it all; the entries come again
	// (same ids), the later one first, and a re-published copy of a member
	// with a later entry id beside them.
	for _, q := range []string{`DELETE FROM meter_aggregates`, `DELETE FROM meter_events`, `DELETE FROM meter_usage`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	b.ingest(t, later)
	b.ingest(t, first[1])
	b.ingest(t, first[0])
	copyOf := first[0]
	copyOf.MessageID = id((s+9)*1000, 0)
	if out := b.ingest(t, copyOf); out[0].Decision != meterledger.InLedger || out[0].Record.StreamMessageID != first[0].MessageID {
		t.Fatalf("a re-published copy: %v, entry %s; want InLedger, the row keeping entry %s", out[0].Decision, out[0].Record.StreamMessageID, first[0].MessageID)
	}
	r1, _, ok1 := form(time.Unix(s+30, 0))
	r2, _, ok2 := form(time.Unix(s+30, 0))
	if !ok1 || !ok2 || r1.Identifier != a1.Identifier || r2.Identifier != a2.Identifier || r1.Value != 7 || r2.Value != 11 {
		t.Fatalf("formed again after the rollback: %s (%d), %s (%d); want %s (7), %s (11)", r1.Identifier, r1.Value, r2.Identifier, r2.Value,
			a1.Identifier, a2.Identifier)
	}

	// A late join: an entry of the first bucket's arrival second queued
	// after it formed (its entry was below the watermark then).
	b.ingest(t, ingestReq(mev("cus_a", "tokens", 3, sec.Add(800*time.Millisecond)), id((s+5)*1000+900, 0)))
	l1, ms, ok := form(time.Unix(s+30, 0))
	if !ok || !l1.LateJoin || len(ms) != 1 || l1.Value != 3 || l1.ArrivalSecond != s+5 || l1.Identifier == a1.Identifier {
		t.Fatalf("a late join: ok %v, late %v, %d members, value %d, %s", ok, l1.LateJoin, len(ms), l1.Value, l1.Identifier)
	}
	if _, _, ok := form(time.Unix(s+30, 0)); ok {
		t.Fatal("formed again with nothing queued")
	}
}

// Members a repair queued again of unknown outcome (their queued witness
// said they may have been sent since, in an aggregate the rollback lost
// with its witness) are never sent on their own: their bucket is formed
// as usual (the same members, so the same identifier as the lost one), of
// unknown outcome since their ingest, and left to a takeover: re-sent
// under that identifier within the safe window, parked past it.
func TestAggregateOfUnknownMembersIsLeftToATakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sec := t0.Add(-time.Minute)
	s := sec.Unix()
	reqs := []meterledger.IngestRequest{
		ingestReq(mev("cus_u", "tokens", 4, sec), fmt.Sprintf("%d-0", (s+2)*1000)),
		ingestReq(mev("cus_u", "tokens", 6, sec.Add(time.Millisecond)), fmt.Sprintf("%d-1", (s+2)*1000)),
	}
	b.ingest(t, reqs...)
	if _, err := b.pool.Exec(ctx, `UPDATE meter_events SET outcome_unknown = true WHERE identifier = $1`, reqs[0].Identifier); err != nil {
		t.Fatal(err)
	}
	a, ms, ok, err := b.l.FormAggregate(ctx, "test", "usage", "tokens", "cus_u", time.Unix(s+10, 0), time.Second, "c", time.Minute)
	want := meterledger.AggregateIdentifier("test", "tokens", "cus_u", sec, []string{reqs[0].Identifier, reqs[1].Identifier})
	if err != nil || ok || len(ms) != 2 || a.Identifier != want || !a.OutcomeUnknown {
		t.Fatalf("forming with a member of unknown outcome: ok %v (want false: not sent now), %d members, %s unknown %v (%v); want %s",
			ok, len(ms), a.Identifier, a.OutcomeUnknown, err, want)
	}
	stale, err := b.l.StaleAggregates(ctx, "usage", 10)
	if err != nil || len(stale) != 1 || stale[0].Identifier != want {
		t.Fatalf("stale aggregates: %+v (%v), want %s for a takeover", stale, err, want)
	}
	if d, got, _, err := b.l.TakeOverAggregate(ctx, stale[0], "live", time.Minute); err != nil || d != meterledger.TakenOver || got.Identifier != want || got.Value != 10 {
		t.Fatalf("takeover within the window: %v %s %d (%v)", d, got.Identifier, got.Value, err)
	}

	// Past the safe window of the members' ingest: parked with them.
	more := ingestReq(mev("cus_v", "tokens", 3, sec), fmt.Sprintf("%d-2", (s+2)*1000))
	b.ingest(t, more)
	if _, err := b.pool.Exec(ctx, `UPDATE meter_events SET outcome_unknown = true WHERE identifier = $1`, more.Identifier); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(meterledger.DefaultSafeWindow + time.Minute)
	if _, _, ok, err := b.l.FormAggregate(ctx, "test", "usage", "tokens", "cus_v", time.Unix(s+10, 0), time.Second, "c", time.Minute); err != nil || ok {
		t.Fatalf("forming past the window: ok %v (%v), want not sent", ok, err)
	}
	stale, err = b.l.StaleAggregates(ctx, "usage", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stale {
		if st.StripeCustomerID != "cus_v" {
			continue
		}
		if d, _, _, err := b.l.TakeOverAggregate(ctx, st, "live", time.Minute); err != nil || d != meterledger.Parked {
			t.Fatalf("past the window: %v (%v), want parked", d, err)
		}
		return
	}
	t.Fatalf("no stale aggregate of cus_v among %d", len(stale))
}
