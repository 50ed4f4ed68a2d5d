package redissentinel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/redissentinel"
	"github.com/pelguard/pelguard/redisurl"
)

// StartSet starts a set for t and stops it at the end; it skips, saying how
// to get one, where redis-server cannot run a sentinel.
func startSet(t *testing.T) *redissentinel.Set {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := startBenchSet(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startBenchSet starts a set for tb, stopped at its end, or skips saying
// how to get a redis-server with sentinel mode. Both passwords are set: the
// URL carries the data nodes' before '@' and the sentinels' as
// sentinel_password; swapped, neither would connect.
func startBenchSet(ctx context.Context, tb testing.TB) (*redissentinel.Set, error) {
	s, err := redissentinel.Start(ctx, redissentinel.Options{Dir: tb.TempDir(), Password: "data-Pw@1", SentinelPassword: "sentinel-Pw#2"})
	if errors.Is(err, redissentinel.ErrUnsupported) {
		tb.Skipf("no Redis Sentinel here: %v", err)
	}
	if err != nil {
		return nil, err
	}
	tb.Cleanup(s.Stop)
	return s, nil
}

// A client from the set's redis+sentinel:// URL writes to the primary,
// follows the promotion after the primary is SIGKILLed (the writes it
// retries land on the new one), reports the new primary, and calls
// OnPrimary once for the first primary and once for the change.
func TestClientFollowsFailover(t *testing.T) {
	t.Parallel()
	s := startSet(t)
	ctx := context.Background()
	cfg, err := redisurl.Parse(s.URL() + "&max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var changes [][2]string
	cfg.OnPrimary = func(old, new string) { mu.Lock(); changes = append(changes, [2]string{old, new}); mu.Unlock() }
	c := cfg.NewClient()
	defer c.Close()
	if err := c.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old, err := s.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := redisurl.Primary(c); p != old.Addr() {
		t.Fatalf("Primary = %q, want %s", p, old.Addr())
	}
	if err := s.WaitReplicated(ctx, 1); err != nil {
		t.Fatal(err)
	}
	s.Kill(old)
	killed := time.Now()
	np, err := s.WaitPromoted(ctx, old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted %s after the SIGKILL", np.Addr(), time.Since(killed).Round(time.Millisecond))
	deadline := time.Now().Add(20 * time.Second)
	for c.Incr(ctx, "k").Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the client did not reach the new primary")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v, err := c.Get(ctx, "k").Int(); err != nil || v != 2 {
		t.Errorf("k = %d (%v), want 2: the replica had the write", v, err)
	}
	if p, _ := redisurl.Primary(c); p != np.Addr() {
		t.Errorf("Primary = %q, want %s", p, np.Addr())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || changes[0] != [2]string{"", old.Addr()} || changes[1] != [2]string{old.Addr(), np.Addr()} {
		t.Errorf("OnPrimary calls %v, want the first primary then one change %s → %s", changes, old.Addr(), np.Addr())
	}
}
