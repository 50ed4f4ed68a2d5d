package meterwitness_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestWitnessKeepsWhatARepairNeeds: members read back as written, from a
// given time on; pruning drops what is older than Retention and records
// the bound, so a repair knows how far back the witness reaches; a writer
// that does not prune (a rollback is open) keeps everything; the registry
// names the stream for its ledger only.
func TestWitnessKeepsWhatARepairNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := meterwitness.Stream{Stream: testenv.Name(t, "mw"), Group: "g", Namespace: "ns"}
	testenv.CleanupKeys(t, rdb, meterwitness.Key(s.Stream, s.Group), meterwitness.RegistryKey(s.Stream), meterwitness.RegistryKey(s.Stream+"-other"))
	ledger := s.Stream // a ledger id of this test's own
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ev := func(id string, st string) meterwitness.Sent {
		return meterwitness.Sent{Status: st, EventTS: t0.Add(-time.Minute), Identifier: id, EventName: "api", StripeCustomerID: "cus_1",
			CustomerID: "c_1", Value: -3, FirstSentAt: t0.Add(-30 * time.Second), MessageID: "1-0", Reason: map[string]string{"parked": "why"}[st]}
	}
	if err := meterwitness.Record(ctx, rdb, ledger, s, []meterwitness.Sent{ev("old", meterwitness.Delivered)}, t0, true); err != nil {
		t.Fatal(err)
	}
	// Three hours later, during an open rollback: nothing pruned.
	if err := meterwitness.Record(ctx, rdb, ledger, s, []meterwitness.Sent{ev("mid", meterwitness.Parked)}, t0.Add(3*time.Hour), false); err != nil {
		t.Fatal(err)
	}
	got, pruned, bad, err := meterwitness.Read(ctx, rdb, s, t0)
	if err != nil || bad != 0 || len(got) != 2 || got[0].Identifier != "old" || got[1].Identifier != "mid" {
		t.Fatalf("read %+v, pruned %v, bad %d, %v: want old and mid", got, pruned, bad, err)
	}
	if g := got[1]; g.Status != meterwitness.Parked || g.Reason != "why" || g.Value != -3 || !g.EventTS.Equal(t0.Add(-time.Minute)) ||
		!g.FirstSentAt.Equal(t0.Add(-30*time.Second)) || !g.At.Equal(t0.Add(3*time.Hour)) || g.CustomerID != "c_1" {
		t.Fatalf("member read back as %+v", g)
	}
	// Pruning again: "old" is past Retention, "mid" is not.
	now := t0.Add(3 * time.Hour)
	if err := meterwitness.Record(ctx, rdb, ledger, s, []meterwitness.Sent{ev("new", meterwitness.Delivered)}, now, true); err != nil {
		t.Fatal(err)
	}
	got, pruned, _, err = meterwitness.Read(ctx, rdb, s, t0)
	ids := map[string]bool{}
	for _, g := range got {
		ids[g.Identifier] = true
	}
	if err != nil || len(got) != 2 || !ids["mid"] || !ids["new"] {
		t.Fatalf("after pruning: %+v, %v", got, err)
	}
	if !pruned.Equal(now.Add(-meterwitness.Retention)) {
		t.Fatalf("pruned below %v, want %v", pruned, now.Add(-meterwitness.Retention))
	}
	streams, err := meterwitness.Streams(ctx, rdb, ledger)
	if err != nil || len(streams) != 1 || streams[0] != s {
		t.Fatalf("registry: %+v, %v", streams, err)
	}
	if other, err := meterwitness.Streams(ctx, rdb, ledger+"-other"); err != nil || len(other) != 0 {
		t.Fatalf("another ledger's registry: %+v, %v", other, err)
	}
}
