package stripelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/pelguard/pelguard/clock"
)

// period scales a fractional rate into redis_rate's integer Rate per
// Period: 95.5/s is 95,500 per 1,000 s, the same emission interval.
const period = 1000 * time.Second

// maxPoll bounds one sleep between tries, so a pause another process sets
// or an outage is noticed within it.
const maxPoll = 250 * time.Millisecond

// bucket is one GCRA schedule in Redis.
type bucket struct {
	key   string
	rate  float64
	burst int // the owner's tolerance, in requests
}

func (b bucket) limit(tolerance int) redis_rate.Limit {
	return redis_rate.Limit{Rate: max(1, int(math.Round(b.rate*float64(period/time.Second)))), Period: period, Burst: tolerance}
}

// step is one bucket a role tries, with the tolerance it tries it at.
type step struct {
	b         *bucket
	tolerance int
}

// Limiter paces one process's Stripe requests against the fleet's shared
// schedule. It implements stripeapi.Limiter. Safe for concurrent use.
type Limiter struct {
	cfg     Config
	clk     clock.Clock
	rdb     redis.UniversalClient
	rl      *redis_rate.Limiter
	log     *slog.Logger
	metrics *metrics

	pool, redriveFloor, auditFloor *bucket
	plan                           []step // tried in order; the first that admits wins
	pauseKey                       string

	semMu sync.Mutex
	sems  map[string]chan struct{} // one waiter per endpoint talks to Redis; the rest queue here

	mu         sync.Mutex
	down       bool      // Redis unreachable: waiting on local
	retryAt    time.Time // when down: next try of Redis
	probing    bool      // one waiter is trying Redis again
	local      *rate.Limiter
	localPause time.Time             // a 429 seen while local
	notBefore  map[*bucket]time.Time // a refused bucket is not asked again before this
	endpoints  map[string]*bucket
}

// New validates cfg and builds a Limiter. It does not connect: the first
// Wait does, and falls back to FallbackRate if Redis does not answer.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("stripelimit: %w", err)
	}
	cfg = cfg.withDefaults()
	l := &Limiter{
		cfg: cfg, clk: cfg.Clock, rdb: cfg.Redis, log: cfg.Logger,
		metrics:   newMetrics(cfg.Registerer, cfg.Role),
		sems:      make(map[string]chan struct{}),
		notBefore: make(map[*bucket]time.Time),
		endpoints: make(map[string]*bucket),
		local:     rate.NewLimiter(rate.Limit(cfg.FallbackRate), max(1, int(cfg.FallbackRate/10))),
		pauseKey:  keyOf(cfg.Account, "pause"),
	}
	if l.rdb != nil {
		l.rl = redis_rate.NewLimiter(l.rdb)
	}
	floorRate := func(f float64) *bucket {
		r := cfg.Rate * f
		if r <= 0 {
			return nil
		}
		// At least 2: a floor's owner then keeps its schedule ahead of now
		// while it uses it, which locks out the borrowers (tolerance 1).
		return &bucket{rate: r, burst: max(2, int(r/10))}
	}
	l.redriveFloor, l.auditFloor = floorRate(cfg.RedriveFloor), floorRate(cfg.AuditFloor)
	if l.redriveFloor != nil {
		l.redriveFloor.key = keyOf(cfg.Account, "floor:"+string(RoleRedrive))
	}
	if l.auditFloor != nil {
		l.auditFloor.key = keyOf(cfg.Account, "floor:"+string(RoleAudit))
	}
	l.pool = &bucket{key: keyOf(cfg.Account, "pool"), rate: cfg.Rate * (1 - cfg.RedriveFloor - cfg.AuditFloor), burst: cfg.Burst}
	l.plan = planFor(cfg.Role, l.pool, l.redriveFloor, l.auditFloor)
	if l.rdb != nil {
		l.metrics.shared.Set(1)
	}
	return l, nil
}

// planFor is the order a role asks the buckets in: its own floor at its
// full tolerance, then the pool at the role's priority tolerance (billing:
// the whole burst; re-drives: half; the auditor: one request, so it only
// takes from a pool nobody is waiting on), then the other roles' floors at a
// tolerance of one request, which admits only while their owner leaves them
// idle: an idle floor is lent, never taken from a role that uses it.
func planFor(role Role, pool, redrive, audit *bucket) []step {
	var plan []step
	add := func(b *bucket, tol int) {
		if b != nil {
			plan = append(plan, step{b: b, tolerance: max(1, tol)})
		}
	}
	switch role {
	case RoleRedrive:
		if redrive != nil {
			add(redrive, redrive.burst)
		}
		add(pool, pool.burst/2)
		add(audit, 1)
	case RoleAudit:
		if audit != nil {
			add(audit, audit.burst)
		}
		add(pool, 1)
		add(redrive, 1)
	default:
		add(pool, pool.burst)
		add(redrive, 1)
		add(audit, 1)
	}
	return plan
}

// keyOf is a Redis key of the account; the hash tag keeps an account's keys
// on one Redis Cluster slot.
func keyOf(account, what string) string {
	return KeyPrefix + "{" + account + "}:" + what
}

// Role is the role the Limiter paces.
func (l *Limiter) Role() Role { return l.cfg.Role }

// Shared reports whether the Limiter currently uses the fleet's schedule
// (false: nil Redis, or an outage).
func (l *Limiter) Shared() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rdb != nil && !l.down
}

// Wait blocks until one request to endpoint ("POST /v1/charges", see
// stripeapi.Endpoint) may be sent, or ctx ends.
func (l *Limiter) Wait(ctx context.Context, endpoint string) error {
	start := l.clk.Now()
	delayed, err := l.wait(ctx, endpoint)
	waited := l.clk.Now().Sub(start)
	l.metrics.wait.Observe(waited.Seconds())
	if err != nil {
		l.metrics.cancelled.Inc()
		return err
	}
	if delayed {
		l.metrics.delayed.Inc()
	} else {
		l.metrics.allowed.Inc()
	}
	return nil
}

func (l *Limiter) wait(ctx context.Context, endpoint string) (delayed bool, err error) {
	semKey := ""
	if l.cfg.EndpointRate > 0 {
		semKey = endpoint
	}
	sem := l.sem(semKey)
	select {
	case sem <- struct{}{}:
	default:
		delayed = true
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return delayed, ctx.Err()
		}
	}
	defer func() { <-sem }()

	if !l.useShared() {
		l.metrics.fallback.Inc()
		d, err := l.waitLocal(ctx)
		return delayed || d, err
	}
	d, err := l.waitShared(ctx, endpoint)
	if err != nil && ctx.Err() == nil {
		// Redis failed us: billing goes on at this process's share.
		l.markDown(err)
		l.metrics.fallback.Inc()
		d2, err := l.waitLocal(ctx)
		return delayed || d || d2, err
	}
	return delayed || d, err
}

// waitShared takes one request from the shared schedule: the endpoint's
// bucket first (when configured), then the role's plan. An error is
// Redis' (or ctx's).
func (l *Limiter) waitShared(ctx context.Context, endpoint string) (delayed bool, err error) {
	if l.cfg.EndpointRate > 0 && endpoint != "" {
		eb := l.endpointBucket(endpoint)
		for {
			ok, retry, err := l.allow(ctx, eb, eb.burst)
			if err != nil {
				return delayed, err
			}
			if ok {
				break
			}
			delayed = true
			if err := l.sleep(ctx, retry); err != nil {
				return delayed, err
			}
		}
	}
	for {
		ok, retry, err := l.tryPlan(ctx)
		if err != nil || ok {
			return delayed, err
		}
		delayed = true
		if err := l.sleep(ctx, retry); err != nil {
			return delayed, err
		}
	}
}

// tryPlan asks the plan's buckets in order, skipping one that refused
// until its retry time, and returns the earliest retry when none admits.
func (l *Limiter) tryPlan(ctx context.Context) (bool, time.Duration, error) {
	now := l.clk.Now()
	soonest := maxPoll
	for _, s := range l.plan {
		l.mu.Lock()
		nb := l.notBefore[s.b]
		l.mu.Unlock()
		if now.Before(nb) {
			soonest = min(soonest, nb.Sub(now))
			continue
		}
		ok, retry, err := l.allow(ctx, s.b, s.tolerance)
		if err != nil {
			return false, 0, err
		}
		if ok {
			return true, 0, nil
		}
		l.mu.Lock()
		l.notBefore[s.b] = now.Add(retry)
		l.mu.Unlock()
		soonest = min(soonest, retry)
	}
	return false, max(soonest, time.Millisecond), nil
}

// allow runs redis_rate's GCRA on b at tolerance, bounded by RedisTimeout.
func (l *Limiter) allow(ctx context.Context, b *bucket, tolerance int) (bool, time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.RedisTimeout)
	defer cancel()
	res, err := l.rl.Allow(cctx, b.key, b.limit(tolerance))
	if err != nil {
		return false, 0, fmt.Errorf("stripelimit: Redis: %w", err)
	}
	if res.Allowed > 0 {
		return true, 0, nil
	}
	return false, max(res.RetryAfter, time.Millisecond), nil
}

// waitLocal takes one request from this process's own share.
func (l *Limiter) waitLocal(ctx context.Context) (delayed bool, err error) {
	now := l.clk.Now()
	l.mu.Lock()
	pause := l.localPause
	l.mu.Unlock()
	if now.Before(pause) {
		delayed = true
		if err := l.sleep(ctx, pause.Sub(now)); err != nil {
			return delayed, err
		}
		now = l.clk.Now()
	}
	r := l.local.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d <= 0 {
		return delayed, nil
	}
	if err := l.sleep(ctx, d); err != nil {
		r.CancelAt(l.clk.Now())
		return true, err
	}
	return true, nil
}

func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-clock.After(l.clk, d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Limiter) sem(key string) chan struct{} {
	l.semMu.Lock()
	defer l.semMu.Unlock()
	s, ok := l.sems[key]
	if !ok {
		s = make(chan struct{}, 1)
		l.sems[key] = s
	}
	return s
}

func (l *Limiter) endpointBucket(endpoint string) *bucket {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.endpoints[endpoint]
	if !ok {
		r := l.cfg.EndpointRate
		b = &bucket{key: keyOf(l.cfg.Account, "endpoint:"+endpoint), rate: r, burst: max(1, int(r/10))}
		l.endpoints[endpoint] = b
	}
	return b
}

// useShared decides whether this waiter uses Redis: while Redis is up,
// yes. During an outage no waiter touches Redis (none waits for a dead
// one): once RetryRedis has passed, one background PING probes it, and the
// waiters after a successful probe share again.
func (l *Limiter) useShared() bool {
	if l.rdb == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down {
		return true
	}
	if !l.probing && !l.clk.Now().Before(l.retryAt) {
		l.probing = true
		go l.probe()
	}
	return false
}

func (l *Limiter) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.RedisTimeout)
	defer cancel()
	if err := l.rdb.Ping(ctx).Err(); err != nil {
		l.markDown(fmt.Errorf("stripelimit: Redis: %w", err))
		return
	}
	l.markUp()
}

func (l *Limiter) markDown(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.metrics.redisErrors.Inc()
	l.probing = false
	l.retryAt = l.clk.Now().Add(l.cfg.RetryRedis)
	if l.down {
		return
	}
	l.down = true
	l.metrics.shared.Set(0)
	l.log.Warn("Stripe rate limit: Redis unreachable; this process falls back to its own share until Redis answers",
		slog.String("role", string(l.cfg.Role)), slog.Float64("fallback_rate", l.cfg.FallbackRate),
		slog.Duration("retry_every", l.cfg.RetryRedis), slog.String("error", err.Error()))
}

func (l *Limiter) markUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probing = false
	if !l.down {
		return
	}
	l.down = false
	l.metrics.shared.Set(1)
	l.log.Info("Stripe rate limit: Redis answers again; sharing the account's rate with the fleet",
		slog.String("role", string(l.cfg.Role)), slog.Float64("rate", l.cfg.Rate))
}

// RateLimited tells the fleet Stripe answered 429 to endpoint: the first
// report within Backoff (SET NX on the pause key) pushes every shared
// schedule Backoff into the future, so every process waits; later reports
// of the same burst do nothing more. This process's own share pauses too.
func (l *Limiter) RateLimited(ctx context.Context, endpoint string) {
	l.metrics.rateLimited.Inc()
	if l.cfg.Backoff <= 0 {
		return
	}
	l.mu.Lock()
	l.localPause = later(l.localPause, l.clk.Now().Add(l.cfg.Backoff))
	down := l.down
	l.mu.Unlock()
	if l.rdb == nil || down {
		return
	}
	if err := l.pauseFleet(ctx, endpoint); err != nil && ctx.Err() == nil {
		l.markDown(err)
	}
}

func (l *Limiter) pauseFleet(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*l.cfg.RedisTimeout)
	defer cancel()
	first, err := l.rdb.SetNX(ctx, l.pauseKey, endpoint, l.cfg.Backoff).Result()
	if err != nil {
		return fmt.Errorf("stripelimit: Redis: %w", err)
	}
	if !first {
		return nil
	}
	l.metrics.pauses.Inc()
	bs := []*bucket{l.pool, l.redriveFloor, l.auditFloor}
	if l.cfg.EndpointRate > 0 && endpoint != "" {
		bs = append(bs, l.endpointBucket(endpoint))
	}
	var errs []error
	for _, b := range bs {
		if b == nil {
			continue
		}
		// Taking Backoff's worth of requests with a tolerance that always
		// admits moves the schedule's theoretical arrival time Backoff ahead.
		n := max(1, int(math.Ceil(b.rate*l.cfg.Backoff.Seconds())))
		if _, err := l.rl.AllowN(ctx, b.key, b.limit(2*n+b.burst+1), n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stripelimit: Redis: %w", err)
	}
	l.log.Info("Stripe answered 429: the fleet pauses", slog.String("endpoint", endpoint),
		slog.String("role", string(l.cfg.Role)), slog.Duration("backoff", l.cfg.Backoff))
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
