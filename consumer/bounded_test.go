package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestStatsKeyExpires: a consumer's published stats key expires StatsTTL
// after its last heartbeat, so the names of dead consumers (a new one per
// process start) leave no key behind; the liveness hash is pruned by the
// reaper's hygiene (TestConsumerHygiene).
func TestStatsKeyExpires(t *testing.T) {
	rdb := testenv.Redis(t)
	stream, group := testenv.Name(t, "billing"), "billing-group"
	key := StatsKey(stream, group, "consumer-1")
	testenv.CleanupKeys(t, rdb, key, LivenessKey(stream, group))
	if err := registerWithStats(context.Background(), rdb, stream, group, "consumer-1", time.Now(), Stats{}); err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > StatsTTL {
		t.Fatalf("stats key PTTL %s, want within (0, %s]", ttl, StatsTTL)
	}
}
