package stripelimit_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripelimit"
)

// run hammers for d and returns when it is over.
func run(d time.Duration, fns ...func(ctx context.Context)) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for _, f := range fns {
		f(ctx)
	}
	<-ctx.Done()
}

// bursts is what GCRA lets through above the rate in any window: the
// pool's burst and two requests per floor, plus the jitter between the
// admission in Redis and the arrival at the emulator, which the emulator's
// one-second windows count: on a loaded 2-core machine requests admitted
// up to a quarter second apart arrive together (a quarter of the rate),
// and two more for rounding. Unshared, two processes would send twice the
// rate: far past this.
func bursts(rate float64) int { return max(1, int(rate/10)) + 2*2 + int(rate/4) + 2 }

// Two processes sharing the account never exceed it together, and one of
// them alone gets the whole rate: an idle share is not lost, as it is when
// the rate is divided by hand.
func TestTwoProcessesShareTheAccountRate(t *testing.T) {
	t.Parallel()
	const rate = 40.0
	b := setup(t, stripesim.Faults{})
	a := b.client(t, b.limiter(t, stripelimit.Config{Rate: rate, Role: stripelimit.RoleBilling}))
	c := b.client(t, b.limiter(t, stripelimit.Config{Rate: rate, Role: stripelimit.RoleBilling}))

	const both = 3 * time.Second
	run(both, func(ctx context.Context) { hammer(ctx, a, 8) }, func(ctx context.Context) { hammer(ctx, c, 8) })
	st := b.meter.Stats(time.Second)
	t.Logf("two processes: %d requests in %s, at most %d in any second (limit %v)", st.Requests, st.Span, st.MaxPerWindow, rate)
	if st.MaxPerWindow > int(rate)+bursts(rate) {
		t.Errorf("%d requests reached Stripe in one second; the account allows %v (+%d burst)", st.MaxPerWindow, rate, bursts(rate))
	}
	// The lower bounds leave room for a loaded machine (shared CI cores);
	// the upper bounds, the point of the limiter, have none to spare.
	if got := float64(st.Requests) / both.Seconds(); got < 0.8*rate {
		t.Errorf("two processes sent %.1f requests/s together; the shared limit is %v: they should use it all", got, rate)
	}

	b.meter.Reset()
	const alone = 2 * time.Second
	run(alone, func(ctx context.Context) { hammer(ctx, a, 8) })
	st = b.meter.Stats(time.Second)
	t.Logf("one process alone: %d requests in %s, at most %d in any second", st.Requests, st.Span, st.MaxPerWindow)
	if got := float64(st.Requests) / alone.Seconds(); got < 0.8*rate {
		t.Errorf("one process alone sent %.1f requests/s; with the other idle it should get the whole %v", got, rate)
	}
	if st.MaxPerWindow > int(rate)+bursts(rate) {
		t.Errorf("%d requests in one second from one process; the account allows %v", st.MaxPerWindow, rate)
	}
}

// Billing first: while billing saturates the account, the reaper's
// re-drives and the auditor's reads get their floors (they never starve)
// and no more; once billing is quiet, the re-drives take the rest.
func TestBillingFirstFloorsKeepTheOthersGoing(t *testing.T) {
	t.Parallel()
	const rate = 40.0
	b := setup(t, stripesim.Faults{})
	billing := b.client(t, b.limiter(t, stripelimit.Config{Rate: rate, Role: stripelimit.RoleBilling}))
	redrive := b.client(t, b.limiter(t, stripelimit.Config{Rate: rate, Role: stripelimit.RoleRedrive}))
	audit := b.client(t, b.limiter(t, stripelimit.Config{Rate: rate, Role: stripelimit.RoleAudit}))

	const d = 3 * time.Second
	var nb, nr, na func() int64
	run(d,
		func(ctx context.Context) { n := hammer(ctx, billing, 8); nb = n.Load },
		func(ctx context.Context) { n := hammer(ctx, redrive, 8); nr = n.Load },
		func(ctx context.Context) { n := hammer(ctx, audit, 8); na = n.Load })
	sec := d.Seconds()
	redriveFloor, auditFloor := rate*stripelimit.DefaultRedriveFloor, rate*stripelimit.DefaultAuditFloor
	t.Logf("all three busy for %s: billing %d, re-drives %d (floor %.0f/s), audit %d (floor %.0f/s)", d, nb(), nr(), redriveFloor, na(), auditFloor)
	if got := float64(nb()) / sec; got < 0.7*(rate-redriveFloor-auditFloor) {
		t.Errorf("billing got %.1f/s of %v while the others were busy: billing comes first", got, rate)
	}
	if share := float64(nb()) / float64(nb()+nr()+na()); share < 0.75 {
		t.Errorf("billing got %.0f%% of the requests while the others were busy; the floors leave it %.0f%%", 100*share, 100*(1-stripelimit.DefaultRedriveFloor-stripelimit.DefaultAuditFloor))
	}
	if got := float64(nr()) / sec; got < 0.6*redriveFloor || got > 2*redriveFloor+1 {
		t.Errorf("re-drives got %.1f/s under full billing; want about their floor %.0f/s", got, redriveFloor)
	}
	if got := float64(na()) / sec; got < 0.5*auditFloor || got > 2*auditFloor+1 {
		t.Errorf("the auditor got %.1f/s under full billing; want about its floor %.0f/s (never starved)", got, auditFloor)
	}
	if st := b.meter.Stats(time.Second); st.MaxPerWindow > int(rate)+bursts(rate) {
		t.Errorf("%d requests in one second; the account allows %v", st.MaxPerWindow, rate)
	}

	run(d,
		func(ctx context.Context) { n := hammer(ctx, redrive, 8); nr = n.Load },
		func(ctx context.Context) { n := hammer(ctx, audit, 8); na = n.Load })
	t.Logf("billing quiet for %s: re-drives %d, audit %d", d, nr(), na())
	if got := float64(nr()) / sec; got < 0.7*(rate-auditFloor) {
		t.Errorf("with billing quiet re-drives got %.1f/s; billing's idle share should be theirs (~%.0f/s)", got, rate-auditFloor)
	}
	if got := float64(na()) / sec; got < 0.5*auditFloor {
		t.Errorf("the auditor got %.1f/s; its floor is %.0f/s", got, auditFloor)
	}
}

// Redis down: each process falls back to its own share (one warning per
// outage), billing never stops; Redis back: the fleet shares again.
func TestRedisDownFallsBackToTheShareAndBack(t *testing.T) {
	t.Parallel()
	const rate, fallback = 40.0, 8.0
	b := setup(t, stripesim.Faults{})
	p := testenv.NewProxy(t, testenv.RedisAddr(t))
	logs := &lineCounter{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	cfg := stripelimit.Config{Rate: rate, FallbackRate: fallback, RetryRedis: 100 * time.Millisecond, Logger: logger}
	cfg.Redis = testenv.RedisThrough(t, p)
	la := b.limiter(t, cfg)
	cfg.Redis = testenv.RedisThrough(t, p)
	lc := b.limiter(t, cfg)
	a, c := b.client(t, la), b.client(t, lc)
	both := func(d time.Duration) {
		run(d, func(ctx context.Context) { hammer(ctx, a, 4) }, func(ctx context.Context) { hammer(ctx, c, 4) })
	}

	both(time.Second)
	if !la.Shared() || !lc.Shared() {
		t.Fatal("with Redis up the limiters should share")
	}
	b.meter.Reset()
	p.Down()
	const outage = 2 * time.Second
	both(outage)
	st := b.meter.Stats(time.Second)
	t.Logf("Redis down for %s: %d requests, at most %d in one second (2 processes × %v/s fallback)", outage, st.Requests, st.MaxPerWindow, fallback)
	if la.Shared() || lc.Shared() {
		t.Error("with Redis down the limiters should use their own share")
	}
	if got := float64(st.Requests) / outage.Seconds(); got < 0.6*2*fallback || got > 2*fallback+4 {
		t.Errorf("during the outage the two processes sent %.1f requests/s; want their fallback shares, 2 × %v", got, fallback)
	}
	if n := logs.count("Redis unreachable"); n != 2 {
		t.Errorf("%d warnings about Redis; want one per process and outage (2)", n)
	}

	p.Up()
	testenv.Eventually(t, 5*time.Second, func() bool {
		run(50*time.Millisecond, func(ctx context.Context) { hammer(ctx, a, 1) }, func(ctx context.Context) { hammer(ctx, c, 1) })
		return la.Shared() && lc.Shared()
	}, "limiters sharing again after Redis came back")
	b.meter.Reset()
	const after = 1500 * time.Millisecond
	both(after)
	st = b.meter.Stats(time.Second)
	t.Logf("Redis back: %d requests in %s, at most %d in one second", st.Requests, after, st.MaxPerWindow)
	if got := float64(st.Requests) / after.Seconds(); got < 0.75*rate {
		t.Errorf("after Redis came back the fleet sent %.1f requests/s; shared again it should use the %v", got, rate)
	}
	if n := logs.count("Redis answers again"); n != 2 {
		t.Errorf("%d lines about Redis coming back; want 2", n)
	}
}

// A 429 seen by one process pauses the other too: the fleet backs off, not
// just the process that got it.
func TestA429PausesEveryProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, stripesim.Faults{})
	const backoff = 600 * time.Millisecond
	la := b.limiter(t, stripelimit.Config{Rate: 50, Backoff: backoff})
	lc := b.limiter(t, stripelimit.Config{Rate: 50, Backoff: backoff, Role: stripelimit.RoleAudit})
	ctx := context.Background()
	if err := lc.Wait(ctx, "GET /v1/charges"); err != nil {
		t.Fatal(err)
	}
	la.RateLimited(ctx, "POST /v1/charges")
	lc.RateLimited(ctx, "GET /v1/charges") // the same burst: no second pause
	start := time.Now()
	if err := lc.Wait(ctx, "GET /v1/charges"); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	t.Logf("the other process waited %s after the 429 (backoff %s)", waited, backoff)
	if waited < backoff*8/10 {
		t.Errorf("the other process waited only %s after a 429; the fleet should pause %s", waited, backoff)
	}
	if waited > 2*backoff {
		t.Errorf("waited %s: a second report of the same burst must not extend the pause", waited)
	}
}

// Stripe limiting below what the fleet was told (--stripe-rate too high):
// the 429s pause the fleet, so far fewer requests are refused than without
// the backoff.
func TestRateLimitedBurstSlowsTheFleet(t *testing.T) {
	t.Parallel()
	const stripeRate, configured = 10.0, 40.0
	fraction := func(backoff time.Duration) float64 {
		b := setup(t, stripesim.Faults{RateLimit: stripeRate, RateBurst: 10})
		a := b.client(t, b.limiter(t, stripelimit.Config{Rate: configured, Backoff: backoff}))
		c := b.client(t, b.limiter(t, stripelimit.Config{Rate: configured, Backoff: backoff}))
		run(3*time.Second, func(ctx context.Context) { hammer(ctx, a, 4) }, func(ctx context.Context) { hammer(ctx, c, 4) })
		st := b.meter.Stats(time.Second)
		return float64(st.RateLimited) / float64(max(1, st.Requests))
	}
	with, without := fraction(500*time.Millisecond), fraction(-1)
	t.Logf("429 fraction: %.2f with the fleet backoff, %.2f without", with, without)
	if with > without/2 {
		t.Errorf("with the backoff %.2f of requests were refused, without %.2f: a 429 should slow the fleet", with, without)
	}
}

// The process-local limit (no Redis: an auditor without REDIS_URL) runs on
// the injected clock.
func TestProcessLocalRunsOnTheInjectedClock(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clk := clock.NewSim(t0)
	l, err := stripelimit.New(stripelimit.Config{Rate: 40, FallbackRate: 10, Clock: clk, Role: stripelimit.RoleAudit})
	if err != nil {
		t.Fatal(err)
	}
	if l.Shared() {
		t.Fatal("no Redis: not shared")
	}
	ctx := context.Background()
	if err := l.Wait(ctx, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Time)
	go func() {
		_ = l.Wait(ctx, "")
		done <- clk.Now()
	}()
	for {
		select {
		case at := <-done:
			if got := at.Sub(t0); got < 100*time.Millisecond {
				t.Fatalf("the second request at 10/s went after %s of clock time; want 100ms", got)
			}
			return
		case <-time.After(time.Millisecond):
			clk.Advance(10 * time.Millisecond)
		}
	}
}

func TestConfigValidateNamesTheFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  stripelimit.Config
		want string
	}{
		{stripelimit.Config{}, "must be positive"},
		{stripelimit.Config{Rate: 10, Account: "sk_live_x y"}, "account"},
		{stripelimit.Config{Rate: 10, Role: "billing2"}, "role"},
		{stripelimit.Config{Rate: 10, FallbackRate: 20}, "fallback"},
		{stripelimit.Config{Rate: 10, RedriveFloor: 0.5, AuditFloor: 0.5}, "floors"},
		{stripelimit.Config{Rate: 10, Backoff: time.Hour}, "backoff"},
	} {
		_, err := stripelimit.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v; want an error about %q", tc.cfg, err, tc.want)
		}
	}
}
