package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/rediscluster"
)

// The drill accepts a Redis Cluster (redis+cluster:// URL) as it does one
// node, and its verdicts hold there: naive double-charges, pelguard never;
// and in the 25 h gap (whose lost XACKs are a hook on a client of the
// cluster) both naive senders over-count and pelguard is exact.
func TestDrillOnRedisCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := rediscluster.Start(ctx, rediscluster.Options{Dir: t.TempDir()})
	if errors.Is(err, rediscluster.ErrUnsupported) {
		t.Skipf("this redis-server cannot run a Redis Cluster: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cfg := testConfig(t, 1)
	cfg.RedisURL = c.URL()
	cfg.Scenarios = []string{"inflight-reclaim", "partial-batch", ScenarioUsage25hGap}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 4 || len(rep.Usage) != 3 {
		t.Fatalf("%d results and %d usage rows, want 4 and 3", len(rep.Results), len(rep.Usage))
	}
	for _, x := range rep.Usage {
		if exact := x.Mode == ModePelguard; exact != (x.OverCountUnits == 0) || x.UnderCountUnits != 0 || x.Failed() {
			t.Errorf("%s %s on the cluster: over-counted %d units, under-counted %d (%s)", x.Scenario, x.Mode,
				x.OverCountUnits, x.UnderCountUnits, x.Error)
		}
	}
	for _, x := range rep.Results {
		switch {
		case x.Mode == ModeNaive && x.DuplicateCharges == 0:
			t.Errorf("%s naive: no duplicate on the cluster", x.Scenario)
		case x.Mode == ModePelguard && x.DuplicateCharges != 0:
			t.Errorf("%s pelguard: %d duplicates on the cluster", x.Scenario, x.DuplicateCharges)
		case x.Flagged != x.DuplicateCharges || x.NetDuplicates != 0:
			t.Errorf("%s %s: flagged %d of %d, %d left", x.Scenario, x.Mode, x.Flagged, x.DuplicateCharges, x.NetDuplicates)
		}
	}
}
