package stripelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripelimit"
)

// TestLimiterKeysExpire: every Redis key the limiter writes (the pool, the
// floors, each endpoint's bucket, the pause) expires by itself, so an
// account's keys do not outlive its traffic; and there is one per endpoint
// shape, not per object id.
func TestLimiterKeysExpire(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Faults{})
	c := b.client(t, b.limiter(t, stripelimit.Config{Rate: 50, Role: stripelimit.RoleRedrive}))
	run(500*time.Millisecond, func(ctx context.Context) { hammer(ctx, c, 4) })
	ctx := context.Background()
	for i := range 20 { // twenty objects of one endpoint: one bucket
		_, _ = c.GetCharge(ctx, fmt.Sprintf("ch_bounded_%d", i))
	}
	keys, err := b.rdb.Keys(ctx, "*"+stripelimit.KeyPrefix+"{"+b.account+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("the limiter wrote no key: nothing to check")
	}
	if len(keys) > 8 {
		t.Errorf("%d limiter keys after one endpoint's traffic: %v", len(keys), keys)
	}
	for _, k := range keys {
		ttl, err := b.rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Errorf("limiter key %s has no expiry (PTTL %s): it would stay for ever", k, ttl)
		}
	}
}
