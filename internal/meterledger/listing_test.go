package meterledger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// The unsent floor is the oldest of a stream's queued events, its events
// sending on their own, and its aggregates in flight (by their second):
// what a sender's listings must not skip. Delivered events do not hold it
// back, and a stream with nothing unsent reads an hour ago.
func TestUnsentFloorCountsEveryUnsentEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	floorIs := func(what string, want time.Time) {
		t.Helper()
		got, err := b.l.UnsentFloor(ctx, "usage")
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(want) {
			t.Fatalf("%s: floor %s, want %s", what, got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
		}
	}
	floorIs("nothing unsent", b.clk.Now().UTC().Add(-time.Hour))

	sec := t0.Add(-time.Hour).Truncate(time.Second)
	b.ingest(t, eventsOfSecond("cus_a", sec, 0, 1, 2)...)
	b.ingest(t, eventsOfSecond("cus_b", sec.Add(10*time.Second), 0, 5)...)
	floorIs("queued", sec)

	formed, err := b.l.FormAggregates(ctx, meterledger.FormRequest{Namespace: "test", Stream: "usage", From: sec,
		Watermark: sec.Add(time.Minute), Width: time.Second, Owner: "c", Lease: time.Minute},
		[]meterledger.MeterKey{{EventName: "tokens", StripeCustomerID: "cus_a"}})
	if err != nil || len(formed) != 1 {
		t.Fatalf("formed %d aggregates (%v), want cus_a's", len(formed), err)
	}
	floorIs("an aggregate in flight", sec)

	ev := mev("cus_c", "api", 1, sec.Add(-5*time.Second))
	b.ingest(t, ingestReq(ev, fmt.Sprintf("%d-0", sec.Add(-5*time.Second).UnixMilli())))
	floorIs("an older event queued", sec.Add(-5*time.Second))
	c := b.one(t, req(ev, "A"))
	if c.Decision != meterledger.Acquired {
		t.Fatalf("reserving an event on its own: %v, want acquired", c.Decision)
	}
	floorIs("an event sending on its own", sec.Add(-5*time.Second))
	b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
	floorIs("that event delivered", sec)

	if res, err := b.l.FinishAggregate(ctx, formed[0].Aggregate, meterledger.Delivered, ""); err != nil || res != meterledger.Delivered {
		t.Fatalf("finishing the aggregate: %v %v", res, err)
	}
	floorIs("the aggregate delivered", sec.Add(10*time.Second))
}

// A hot customer-meter (ListFrom.Hot: one that lately sent aggregates of
// many events) is listed ahead of older work whenever it has a ready
// bucket, even where the limit would cut it; with nothing ready it is not
// listed at all.
func TestHotCustomerIsListedAheadOfOlderWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sec := t0.Add(-time.Hour).Truncate(time.Second)
	var reqs []meterledger.IngestRequest
	for i := range 5 {
		reqs = append(reqs, eventsOfSecond(fmt.Sprintf("cus_quiet%d", i), sec.Add(time.Duration(i)*time.Second), i, 1)...)
	}
	busySec := sec.Add(30 * time.Second)
	reqs = append(reqs, eventsOfSecond("cus_busy", busySec, 9, 1, 2, 3)...)
	// Another hot customer whose only bucket is still open at the watermark.
	reqs = append(reqs, eventsOfSecond("cus_open", sec.Add(2*time.Minute), 9, 1)...)
	b.ingest(t, reqs...)
	mark := sec.Add(time.Minute)
	list := func(hot ...meterledger.MeterKey) []string {
		t.Helper()
		cands, err := b.l.Candidates(ctx, "usage", 3, []string{"tokens"}, mark, &meterledger.ListFrom{Hot: hot})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range cands {
			got = append(got, r.StripeCustomerID)
		}
		return got
	}
	if got := list(); slices.Contains(got, "cus_busy") || len(got) != 3 || got[0] != "cus_quiet0" {
		t.Fatalf("listed %v with no hot customer, want the 3 oldest quiet customers", got)
	}
	busy := meterledger.MeterKey{EventName: "tokens", StripeCustomerID: "cus_busy"}
	open := meterledger.MeterKey{EventName: "tokens", StripeCustomerID: "cus_open"}
	if got := list(open, busy); len(got) != 3 || got[0] != "cus_busy" || got[1] != "cus_quiet0" || slices.Contains(got, "cus_open") {
		t.Fatalf("listed %v with cus_busy and cus_open hot, want cus_busy first, then the oldest (cus_open has nothing ready)", got)
	}
}
