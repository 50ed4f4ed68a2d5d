package reaper_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// Explain decides as a pass decides: over a PEL with an entry of every kind
// a pass can decide without acting (gone, invalid, already billed,
// conflict, live lease, claim, unregistered owner), Explain's verdict for
// each entry — asked in any order — is the dry-run pass's (kind, key and
// reason), on the same clock, and neither changes anything.
func TestExplainDecidesAsADryRunPass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	live, slow := ev(1), ev(2)
	ids := b.add(t, live, slow, ev(3), ev(4), ev(5))
	invalid, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"customer_id":"c_9"}`}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	b.read(t, "consumer-a", 7)
	b.reserve(t, live, "consumer-a", time.Hour)      // lease_live
	b.reserve(t, slow, "consumer-a", 10*time.Second) // claim once the clock passes its lease
	b.charge(t, ev(3))                               // already_billed
	conflicting := ev(4)
	conflicting.AmountCents++
	b.charge(t, conflicting) // conflict
	if err := b.rdb.XDel(ctx, b.stream, ids[4]).Err(); err != nil {
		t.Fatal(err) // gone
	}
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "team-consumer",
		Streams: []string{b.stream, ">"}, Count: 1, Block: -1}).Err(); err != redis.Nil {
		t.Fatalf("nothing new to read, got %v", err)
	}
	unreg := b.add(t, ev(6))[0]
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "team-consumer",
		Streams: []string{b.stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err) // unregistered_consumer
	}
	b.clk.Advance(time.Minute)
	b.waitIdle(t, 7, time.Millisecond)
	before := b.snapshotLedger(t)

	cfg := b.config(t, "reaper-dry")
	cfg.DryRun, cfg.Stripe = true, nil
	r := b.newReaper(t, cfg)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	pass := map[string]reaper.Decision{}
	for _, d := range b.decisions {
		pass[d.ID] = d
	}
	want := map[string]reaper.Kind{ids[0]: reaper.KindLeaseLive, ids[1]: reaper.KindClaim, ids[2]: reaper.KindAlreadyBilled,
		ids[3]: reaper.KindConflict, ids[4]: reaper.KindGone, invalid: reaper.KindInvalid, unreg: reaper.KindUnregistered}
	for id, k := range want {
		if pass[id].Kind != k {
			t.Fatalf("the dry run decided %q for %s, the test expects %q", pass[id].Kind, id, k)
		}
	}

	pend := b.pending(t)
	rand.Shuffle(len(pend), func(i, j int) { pend[i], pend[j] = pend[j], pend[i] })
	xs, err := r.Explain(ctx, b.stream, pend)
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != len(pend) {
		t.Fatalf("%d explanations for %d entries", len(xs), len(pend))
	}
	for i, x := range xs {
		d, p := x.Decision, pass[pend[i].ID]
		if d.ID != pend[i].ID {
			t.Fatalf("explanation %d is of %s, asked for %s", i, d.ID, pend[i].ID)
		}
		if d.Kind != p.Kind || d.Key != p.Key || d.Reason != p.Reason {
			t.Errorf("%s: Explain says %s %q %q, the pass %s %q %q", d.ID, d.Kind, d.Key, d.Reason, p.Kind, p.Key, p.Reason)
		}
		if !x.Due {
			t.Errorf("%s: idle %s past min-idle but not due", d.ID, d.Idle)
		}
		if (x.Row != nil) != (d.Kind == reaper.KindLeaseLive || d.Kind == reaper.KindClaim || d.Kind == reaper.KindAlreadyBilled || d.Kind == reaper.KindConflict) {
			t.Errorf("%s (%s): row %+v", d.ID, d.Kind, x.Row)
		}
		if d.ID == ids[0] && (x.Row == nil || !x.Row.LeaseLive || x.Row.LeaseOwner != "consumer-a") {
			t.Errorf("the live entry's row: %+v", x.Row)
		}
		if x.Registered != (d.Consumer != "team-consumer") {
			t.Errorf("%s owned by %s: registered %v", d.ID, d.Consumer, x.Registered)
		}
	}
	if got := len(b.pending(t)); got != 7 {
		t.Errorf("%d entries pending after Explain, want 7", got)
	}
	if after := b.snapshotLedger(t); !slices.Equal(after, before) {
		t.Errorf("the ledger changed:\nbefore %v\nafter  %v", before, after)
	}
}

// Every pass is recorded in each stream's pass log, newest first, the last
// PassLogLength kept.
func TestPassLogKeepsTheLastPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testenv.CleanupKeys(t, b.rdb, reaper.PassesKey(b.stream), consumer.LivenessKey(b.stream, b.group))
	b.add(t, ev(1))
	b.read(t, "consumer-a", 1)
	b.waitIdle(t, 1, time.Millisecond)
	cfg := b.config(t, "reaper-log")
	cfg.DryRun, cfg.Stripe = true, nil
	r := b.newReaper(t, cfg)
	for range reaper.PassLogLength + 3 {
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		b.clk.Advance(time.Second)
	}
	ps, err := reaper.RecentPasses(context.Background(), b.rdb, b.stream, 2*reaper.PassLogLength)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != reaper.PassLogLength {
		t.Fatalf("%d passes kept, want %d", len(ps), reaper.PassLogLength)
	}
	for i, p := range ps {
		if p.Reaper != "reaper-log" || !p.DryRun || p.Scanned != 1 || p.Decisions[reaper.KindClaim] != 1 || p.MinIdle != time.Millisecond {
			t.Fatalf("pass %d: %+v", i, p)
		}
		if i > 0 && !p.Started.Before(ps[i-1].Started) {
			t.Fatalf("pass %d started %s, not before pass %d's %s", i, p.Started, i-1, ps[i-1].Started)
		}
	}
}
