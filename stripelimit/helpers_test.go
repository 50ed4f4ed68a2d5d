package stripelimit_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

const testKey = "sk_test_pelguard_limiter"

// bundle is one test's world: an emulator behind a Meter that records every
// request's arrival, and an account name of its own on the real Redis.
type bundle struct {
	sim     *stripesim.Server
	meter   *stripesim.Meter
	url     string
	account string
	rdb     *redis.Client
}

func setup(t *testing.T, faults stripesim.Faults) *bundle {
	t.Helper()
	sim, err := stripesim.New(stripesim.Config{Seed: 1, Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	meter := stripesim.NewMeter(sim)
	srv := httptest.NewServer(meter)
	t.Cleanup(srv.Close)
	b := &bundle{sim: sim, meter: meter, url: srv.URL, rdb: testenv.Redis(t),
		account: strings.NewReplacer(":", "-").Replace(testenv.Name(t, "acct"))}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := b.rdb.Keys(ctx, "*"+stripelimit.KeyPrefix+"{"+b.account+"}*").Result()
		if len(keys) > 0 {
			_ = b.rdb.Del(ctx, keys...).Err()
		}
	})
	return b
}

// limiter builds a Limiter of the bundle's account over its own Redis
// client (one per "process").
func (b *bundle) limiter(t *testing.T, cfg stripelimit.Config) *stripelimit.Limiter {
	t.Helper()
	cfg.Account = b.account
	if cfg.Redis == nil {
		opt, err := redis.ParseURL(testenv.RedisURL())
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		cfg.Redis = c
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	l, err := stripelimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (b *bundle) client(t *testing.T, lim stripeapi.Limiter) *stripeapi.Client {
	t.Helper()
	c, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: b.url, MaxNetworkRetries: stripeapi.NoRetries,
		Timeout: 10 * time.Second, Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hammer runs workers that send one cheap request (a GET of a charge that
// does not exist: one counted request each) after another until ctx ends,
// and returns how many each sent.
func hammer(ctx context.Context, c *stripeapi.Client, workers int) *atomic.Int64 {
	var n atomic.Int64
	for range workers {
		go func() {
			for ctx.Err() == nil {
				_, _ = c.GetCharge(ctx, "ch_missing") // 404: one request
				if ctx.Err() == nil {
					n.Add(1)
				}
			}
		}()
	}
	return &n
}

// countingHandler counts log lines containing a substring.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.lines = append(c.lines, string(p))
	c.mu.Unlock()
	return len(p), nil
}

func (c *lineCounter) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}
