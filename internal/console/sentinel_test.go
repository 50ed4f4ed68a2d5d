package console

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/redissentinel"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/redisurl"
)

// Through Redis Sentinel, the overview's Streams panel names the primary
// the console's connections reach: the first one, then, after it is
// SIGKILLed, the promoted replica.
func TestOverviewNamesTheSentinelPrimary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	set, err := redissentinel.Start(ctx, redissentinel.Options{Dir: t.TempDir()})
	if errors.Is(err, redissentinel.ErrUnsupported) {
		t.Skipf("no Redis Sentinel here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Stop)
	rdb, err := redisurl.Open(set.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	b := setup(t, func(c *Config) { c.Redis = rdb })
	c := b.login(t, "alice")
	old, err := set.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if page := c.mustGet("/"); !strings.Contains(page, `<span class="redis-primary">`+old.Addr()+`</span>`) {
		t.Fatalf("the overview does not name the primary %s", old.Addr())
	}
	set.Kill(old)
	np, err := set.WaitPromoted(ctx, old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(c.get("/").body, `<span class="redis-primary">`+np.Addr()+`</span>`)
	}, "the overview names the promoted primary %s", np.Addr())
}
