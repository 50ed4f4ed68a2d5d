// Package stripelimit paces Stripe requests for a whole pelguard fleet: every
// consumer, reaper and auditor that shares a Redis and a Stripe account
// shares one rate limit, with billing served first.
//
// Stripe limits requests per account (100/s live, 25/s in a sandbox), not
// per process or per key. A limit per process either overspends the account
// (three replicas each at the full rate draw 429s) or idles (each at a third
// while the others are quiet). A Limiter here keeps the account's schedule
// in Redis with GCRA (github.com/go-redis/redis_rate), so an idle role's
// share is there for the others, and:
//
//   - priority: the roles draw on one pool with different tolerances, so
//     when the pool is saturated only billing is admitted from it ("billing
//     first"), then re-drives, then the auditor's reads;
//   - floors: the reaper and the auditor each have a small reserved bucket
//     of their own (RedriveFloor, AuditFloor), so they never starve; a floor
//     its owner leaves idle is lent to the other roles;
//   - endpoints: an optional bucket per Stripe endpoint (EndpointRate), for
//     Stripe's per-endpoint limits;
//   - 429s: a 429 seen by any process pauses the whole fleet for Backoff;
//   - Redis down: the process falls back to FallbackRate alone (one warning
//     per outage), so billing never stops for Redis, and shares again when
//     Redis answers.
//
// The sum of the pool and the floors is Rate, so whatever the mix of roles
// and processes the fleet never asks for more than Rate (plus the bursts).
package stripelimit

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/clock"
)

// Role is the part of the fleet a Limiter paces; it decides priority.
type Role string

// The roles, in priority order.
const (
	// RoleBilling is the consumer's charges: first.
	RoleBilling Role = "billing"
	// RoleRedrive is the reaper's re-drives: next, with RedriveFloor.
	RoleRedrive Role = "redrive"
	// RoleAudit is the auditor's listing and refunds: last, with AuditFloor.
	RoleAudit Role = "audit"
)

// Roles lists every role in priority order.
var Roles = []Role{RoleBilling, RoleRedrive, RoleAudit}

// Defaults applied by New.
const (
	// DefaultAccount names the Stripe account when Config.Account is empty.
	// Give each Stripe account its own name when several share one Redis
	// (the account id, acct_…, is a good one); never the key: each program
	// has its own restricted key, and all of them share the account's limit.
	DefaultAccount = "default"
	// DefaultRedriveFloor and DefaultAuditFloor are the reserved fractions
	// of Rate (-1, not 0, reserves nothing).
	DefaultRedriveFloor = 0.10
	DefaultAuditFloor   = 0.05
	// DefaultBackoff is the fleet's pause after a 429.
	DefaultBackoff = time.Second
	// DefaultRedisTimeout bounds each Redis call, so a hung Redis delays a
	// Stripe request by at most this before the fallback takes over.
	DefaultRedisTimeout = 250 * time.Millisecond
	// DefaultRetryRedis is how long the fallback lasts before Redis is
	// tried again.
	DefaultRetryRedis = time.Second
	// KeyPrefix starts every Redis key of the limiter.
	KeyPrefix = "pelguard:stripe-rate:"
	// MeterEventsRate is Stripe's live-mode limit of meter events (POST
	// /v1/billing/meter_events): 1,000 calls/s per account, a limit of its
	// own outside the basic 100/s (docs.stripe.com/rate-limits). In test
	// mode they count against the basic 25/s instead.
	MeterEventsRate = 1000
	// MeterEventsSuffix follows the account's name in the name of its
	// meter-events schedule (see ForMeterEvents).
	MeterEventsSuffix = ".meter-events"
)

// Config configures a Limiter. Rate is required.
type Config struct {
	// Account names the Stripe account whose limit is shared: every process
	// with the same Redis and Account shares one schedule. DefaultAccount
	// when empty; letters, digits, '.', '_' and '-', at most 64.
	Account string
	// Role is this process's part; RoleBilling when empty.
	Role Role
	// Rate is the account's requests per second, shared by the fleet.
	Rate float64
	// Burst is the pool's burst in requests: how far ahead of the schedule
	// billing may run. Default max(1, Rate/10), a tenth of a second; keep
	// it below Stripe's own tolerance.
	Burst int
	// Redis holds the shared schedule. nil: this process alone, at
	// FallbackRate (an auditor without REDIS_URL).
	Redis redis.UniversalClient
	// FallbackRate is this process's requests per second when Redis is nil
	// or unreachable. Default Rate/4; size it so that every process at its
	// fallback stays within Rate (Rate ÷ processes).
	FallbackRate float64
	// RedriveFloor and AuditFloor reserve fractions of Rate for the
	// reaper's re-drives and the auditor's reads, so billing cannot starve
	// them. Defaults DefaultRedriveFloor and DefaultAuditFloor; -1 (not 0)
	// reserves nothing. Every process of the fleet must use the same values:
	// the pool is Rate × (1 − RedriveFloor − AuditFloor).
	RedriveFloor, AuditFloor float64
	// EndpointRate, when positive, limits each Stripe endpoint (method and
	// path template, e.g. "POST /v1/charges") to this many requests per
	// second across the fleet, on top of Rate. Stripe's documented default
	// is 25/s per endpoint unless raised for the account.
	EndpointRate float64
	// Backoff is the pause the whole fleet takes after a 429. Default
	// DefaultBackoff; -1 (not 0) disables it.
	Backoff time.Duration
	// RedisTimeout bounds each Redis call. Default DefaultRedisTimeout.
	RedisTimeout time.Duration
	// RetryRedis is how long an outage's fallback lasts before Redis is
	// tried again. Default DefaultRetryRedis.
	RetryRedis time.Duration
	// Clock paces the waits (clock.After) and the fallback; nil is the wall
	// clock. The shared schedule runs on Redis' clock (TIME), the one clock
	// every process of the fleet reads.
	Clock clock.Clock
	// Logger gets one warning per Redis outage and one line when it ends.
	Logger *slog.Logger
	// Registerer, when set, receives the pelguard_stripe_limiter_* series.
	Registerer prometheus.Registerer
}

var accountRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Validate reports a configuration New would refuse.
func (c Config) Validate() error {
	var errs []error
	if c.Account != "" && !accountRE.MatchString(c.Account) {
		errs = append(errs, fmt.Errorf("account %q: use letters, digits, '.', '_' or '-' (at most 64), e.g. the account id acct_…", c.Account))
	}
	switch c.Role {
	case "", RoleBilling, RoleRedrive, RoleAudit:
	default:
		errs = append(errs, fmt.Errorf("role %q: want %s, %s or %s", c.Role, RoleBilling, RoleRedrive, RoleAudit))
	}
	if !(c.Rate > 0) {
		errs = append(errs, fmt.Errorf("rate %v: the account's requests per second must be positive", c.Rate))
	}
	if c.Burst < 0 {
		errs = append(errs, fmt.Errorf("negative burst %d", c.Burst))
	}
	if c.FallbackRate < 0 || (c.Rate > 0 && c.FallbackRate > c.Rate) {
		errs = append(errs, fmt.Errorf("fallback rate %v: want 0 (Rate/4) up to the account's rate %v", c.FallbackRate, c.Rate))
	}
	rf, af := c.floors()
	if rf < 0 || rf >= 1 || af < 0 || af >= 1 || rf+af >= 0.9 {
		errs = append(errs, fmt.Errorf("floors %v (re-drives) and %v (audit): each a fraction in [0, 1), together below 0.9, so billing keeps most of the rate", rf, af))
	}
	if c.EndpointRate < 0 {
		errs = append(errs, fmt.Errorf("negative endpoint rate %v", c.EndpointRate))
	}
	if c.Backoff < -1 || c.Backoff > time.Minute {
		errs = append(errs, fmt.Errorf("backoff %s: want up to 1m (-1: none)", c.Backoff))
	}
	if c.RedisTimeout < 0 || c.RetryRedis < 0 {
		errs = append(errs, errors.New("negative RedisTimeout or RetryRedis"))
	}
	return errors.Join(errs...)
}

// ForMeterEvents is c made for the limiter of live-mode meter events, to
// give stripeapi.Config.MeterLimiter: the same Redis, role, re-drive floor, backoff
// and logger, a schedule of its own (Account + MeterEventsSuffix, so the
// fleet's meter events and its other calls never draw on each other) at
// MeterEventsRate. Burst and FallbackRate return to their defaults for the
// new rate (set them after, and Rate, for an account whose limit Stripe
// raised); EndpointRate is dropped: the meter-events limit is already one
// endpoint's. A 429 on meter events pauses the meter-event schedule only.
// Registerer is dropped as well: this limiter's series would have the
// account limiter's names and roles, and a registry refuses them twice;
// give it a Registerer of its own (another registry) to export them.
// In test mode Stripe counts meter events against the basic limit: use the
// account's limiter for them (leave MeterLimiter nil).
func (c Config) ForMeterEvents() Config {
	c.Account = cmp.Or(c.Account, DefaultAccount) + MeterEventsSuffix
	c.Rate = MeterEventsRate
	c.Burst, c.FallbackRate, c.EndpointRate = 0, 0, 0
	c.Registerer = nil
	// The auditor sends no meter events but its rare corrections (issue
	// 29), which borrow from the pool: reserving it a share of this
	// schedule would only hold billing below Stripe's limit.
	c.AuditFloor = -1
	return c
}

// floors returns the reserved fractions with defaults applied.
func (c Config) floors() (redrive, audit float64) {
	f := func(v, def float64) float64 {
		switch {
		case v == 0:
			return def
		case v == -1:
			return 0
		}
		return v
	}
	return f(c.RedriveFloor, DefaultRedriveFloor), f(c.AuditFloor, DefaultAuditFloor)
}

func (c Config) withDefaults() Config {
	c.Account = cmp.Or(c.Account, DefaultAccount)
	c.Role = cmp.Or(c.Role, RoleBilling)
	c.RedriveFloor, c.AuditFloor = c.floors()
	if c.Burst == 0 {
		c.Burst = max(1, int(c.Rate/10))
	}
	if c.FallbackRate == 0 {
		c.FallbackRate = c.Rate / 4
	}
	switch c.Backoff {
	case 0:
		c.Backoff = DefaultBackoff
	case -1:
		c.Backoff = 0
	}
	c.RedisTimeout = cmp.Or(c.RedisTimeout, DefaultRedisTimeout)
	c.RetryRedis = cmp.Or(c.RetryRedis, DefaultRetryRedis)
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
