package rediscluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/rediscluster"
)

// startCluster starts a 3×2 cluster in the test's temp dir. It skips only
// when the local Redis cannot run a cluster at all.
func startCluster(t testing.TB) *rediscluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := rediscluster.Start(ctx, rediscluster.Options{Dir: t.TempDir()})
	if errors.Is(err, rediscluster.ErrUnsupported) {
		t.Skipf("this redis-server cannot run a Redis Cluster: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func TestStartKillPromote(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := context.Background()
	rdb := c.Client()
	defer rdb.Close()
	if err := rdb.Set(ctx, "k{1}", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.MasterOf(ctx, "k{1}")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Kill(m)
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("replica promoted %s after the SIGKILL", time.Since(start).Round(time.Millisecond))
	m2, err := c.MasterOf(ctx, "k{1}")
	if err != nil || m2 == m {
		t.Fatalf("master after failover = %v, %v", m2, err)
	}
	// The client learnt the old topology before the kill: its first command
	// for the dead master's slots fails (connection refused) and triggers a
	// topology reload; a retry, as the consumer's read loop makes, succeeds.
	var v string
	for range 50 {
		if v, err = rdb.Get(ctx, "k{1}").Result(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || v != "v" {
		t.Fatalf("GET after failover = %q, %v", v, err)
	}
}
