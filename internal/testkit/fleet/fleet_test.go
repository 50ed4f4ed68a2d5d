package fleet_test

import (
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripelimit"
)

// A burst of 429s: the fleet was told a rate four times what Stripe
// allows. Every 429 pauses the whole fleet, so few requests are refused;
// the refused charges stay pending (retry_later) and the reaper re-drives
// them: every event billed, none twice.
func TestFleetBurstOf429sBillsEveryEventOnce(t *testing.T) {
	t.Parallel()
	const n, stripeRate, told = 150, 15.0, 60.0
	w := newWorld(t, stripesim.Faults{RateLimit: stripeRate, RateBurst: int(stripeRate)})
	w.seed(t, n)
	w.killOne(t, 10) // the reaper has re-drives to do from the start
	l := limits{rate: told, backoff: 500 * time.Millisecond}
	for _, name := range []string{"c1", "c2"} {
		w.startConsumer(t, name, 8, w.newProc(t, stripelimit.RoleBilling, 4, l))
	}
	w.startReaper(t, w.newProc(t, stripelimit.RoleRedrive, 4, l))
	start := time.Now()
	testenv.Eventually(t, 2*time.Minute, func() bool { return w.charged(t) == n && w.pending(t) == 0 }, "every event billed and acked")
	elapsed := time.Since(start)
	w.stopAll()
	st := w.meter.Stats(time.Second)
	frac := float64(st.RateLimited) / float64(max(1, st.Requests))
	t.Logf("%d events in %s: %d requests, %d answered 429 (%.1f%%), at most %d in one second (Stripe allows %v, the fleet was told %v)",
		n, elapsed.Round(time.Millisecond), st.Requests, st.RateLimited, 100*frac, st.MaxPerWindow, stripeRate, told)
	if st.RateLimited == 0 {
		t.Error("no 429 at all: the test did not make the burst it is about")
	}
	if frac > 0.4 {
		t.Errorf("%.0f%% of requests answered 429; a 429 should pause the fleet (without it about 75%% would be)", 100*frac)
	}
	w.checkExactlyOnce(t, n)
}

// Redis (the limiter's) unreachable in the middle of billing: each consumer
// falls back to its own share, billing goes on; Redis back: they share
// again. No event lost, none charged twice.
func TestFleetRedisOutageLosesNoEvent(t *testing.T) {
	t.Parallel()
	const n, rate, fallback = 240, 40.0, 10.0
	w := newWorld(t, stripesim.Faults{})
	w.seed(t, n)
	p := testenv.NewProxy(t, testenv.RedisAddr(t))
	var procs []*proc
	for _, name := range []string{"c1", "c2"} {
		pr := w.newProc(t, stripelimit.RoleBilling, 4, limits{rate: rate, fallback: fallback, limiterRedis: testenv.RedisThrough(t, p)})
		procs = append(procs, pr)
		w.startConsumer(t, name, 8, pr)
	}
	shared := func(want bool) func() bool {
		return func() bool { return procs[0].limiter.Shared() == want && procs[1].limiter.Shared() == want }
	}
	testenv.Eventually(t, time.Minute, func() bool { return w.charged(t) >= 40 }, "billing under way")
	p.Down()
	down := time.Now()
	testenv.Eventually(t, 10*time.Second, shared(false), "both consumers on their own share")
	testenv.Eventually(t, time.Minute, func() bool { return w.charged(t) >= 120 }, "billing going on while Redis is down")
	up := time.Now()
	during := float64(w.meter.Between(down, up)) / up.Sub(down).Seconds()
	t.Logf("Redis down for %s: %.1f requests/s (2 consumers × %v/s fallback)", up.Sub(down).Round(time.Millisecond), during, fallback)
	if during > 2*fallback*1.3+2 {
		t.Errorf("%.1f requests/s while Redis was down; each consumer's share is %v/s", during, fallback)
	}
	p.Up()
	testenv.Eventually(t, 10*time.Second, shared(true), "both consumers sharing again")
	testenv.Eventually(t, 2*time.Minute, func() bool { return w.charged(t) == n && w.pending(t) == 0 }, "every event billed and acked")
	w.stopAll()
	if st := w.meter.Stats(time.Second); st.MaxPerWindow > int(rate)+10 {
		t.Errorf("%d requests in one second; the account's rate is %v", st.MaxPerWindow, rate)
	}
	w.checkExactlyOnce(t, n)
}
