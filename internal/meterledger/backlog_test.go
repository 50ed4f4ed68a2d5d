package meterledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// The unsent backlog per meter of one stream: queued events counted per
// meter, the busiest customer's share, and when the oldest was recorded;
// another stream's events and events a sender took (sending) are not in
// it, and a meter with nothing queued is left out.
func TestBacklogByMeter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var reqs []meterledger.IngestRequest
	for i := range 5 {
		reqs = append(reqs, ingestReq(mev("cus_busy", "api_calls", 1, t0.Add(-time.Duration(i)*time.Second)), fmt.Sprintf("1-%d", i)))
	}
	reqs = append(reqs, ingestReq(mev("cus_quiet", "api_calls", 1, t0.Add(-time.Minute)), "2-0"))
	other := ingestReq(mev("cus_busy", "tokens", 7, t0), "3-0")
	other.Stream = "other-usage"
	reqs = append(reqs, other)
	b.ingest(t, reqs...)
	recordedFirst := b.clk.Now().UTC()
	b.clk.Advance(2 * time.Minute)
	b.ingest(t, ingestReq(mev("cus_quiet", "tokens", 3, t0.Add(time.Second)), "4-0"))

	got, err := b.l.BacklogByMeter(ctx, "usage")
	if err != nil {
		t.Fatal(err)
	}
	want := []meterledger.MeterBacklog{
		{EventName: "api_calls", Queued: 6, Busiest: 5, Oldest: recordedFirst},
		{EventName: "tokens", Queued: 1, Busiest: 1, Oldest: b.clk.Now().UTC()},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("backlog of usage:\n got %v\nwant %v", got, want)
	}

	// A sender takes the next event of each customer-meter: they are
	// sending, no longer queued.
	un, err := b.l.Unsent(ctx, "usage", 10)
	if err != nil || len(un) != 3 {
		t.Fatalf("unsent: %d (%v), want one per customer-meter (3)", len(un), err)
	}
	var rs []meterledger.Request
	for _, r := range un {
		rs = append(rs, meterledger.Request{Event: meterledger.EventOf(r), Identifier: r.Identifier, Owner: "s", Lease: time.Minute,
			MessageID: r.StreamMessageID})
	}
	for i, c := range b.reserve(t, rs...) {
		if !c.Decision.MaySend() {
			t.Fatalf("reserve %d: %v", i, c.Decision)
		}
	}
	got, err = b.l.BacklogByMeter(ctx, "usage")
	if err != nil {
		t.Fatal(err)
	}
	want = []meterledger.MeterBacklog{{EventName: "api_calls", Queued: 4, Busiest: 4, Oldest: recordedFirst}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("backlog of usage once a sender took an event of each customer-meter:\n got %v\nwant %v", got, want)
	}
}
