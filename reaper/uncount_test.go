package reaper

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// uncount.lua restores the count only while the entry is the caller's: once
// another consumer claimed it, that delivery stands and the owner is kept.
func TestUncountOnlyWhileOurs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "uncount")
	testenv.CleanupKeys(t, rdb, stream)
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": "{}"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	claim := func(who string) { // without JUSTID: it counts a delivery, as the reaper's claim does
		if err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "g", Consumer: who, Messages: []string{id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	entry := func() redis.XPendingExt {
		p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
		if err != nil || len(p) != 1 {
			t.Fatalf("pending %v %v", p, err)
		}
		return p[0]
	}
	uncount := func() int64 {
		n, err := uncountScript.Run(ctx, rdb, []string{stream}, "g", "reaper", id, 1).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	claim("reaper") // delivery 2, the reaper's
	if e := entry(); e.RetryCount != 2 {
		t.Fatalf("precondition: %+v, want 2 deliveries", e)
	}
	if n := uncount(); n != 1 {
		t.Fatalf("uncount of our entry = %d, want 1", n)
	}
	if e := entry(); e.RetryCount != 1 || e.Consumer != "reaper" {
		t.Fatalf("after uncount: %+v, want 1 delivery, held by the reaper", e)
	}
	claim("other") // delivery 2, someone else's
	if n := uncount(); n != 0 {
		t.Fatalf("uncount of another's entry = %d, want 0", n)
	}
	if e := entry(); e.RetryCount != 2 || e.Consumer != "other" {
		t.Fatalf("after a refused uncount: %+v, want 2 deliveries, held by other", e)
	}
}
