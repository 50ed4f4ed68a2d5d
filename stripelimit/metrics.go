package stripelimit

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pelguard_stripe_limiter_* series of one Limiter; every
// series carries the role, so one dashboard shows the fleet's split.
type metrics struct {
	allowed, delayed, cancelled prometheus.Counter
	fallback                    prometheus.Counter
	wait                        prometheus.Observer
	rateLimited, pauses         prometheus.Counter
	redisErrors                 prometheus.Counter
	shared                      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, role Role) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pelguard_stripe_limiter_requests_total",
		Help: "Stripe requests paced by the limiter, by role and result: allowed (sent at once), delayed (waited first), cancelled (gave up waiting).",
	}, []string{"role", "result"})
	fallback := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pelguard_stripe_limiter_fallback_requests_total",
		Help: "Stripe requests paced by this process's own share (Redis unreachable, or none configured).",
	}, []string{"role"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pelguard_stripe_limiter_wait_seconds",
		Help:    "Time a Stripe request waited for the rate limit, by role.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"role"})
	rateLimited := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pelguard_stripe_limiter_rate_limited_total",
		Help: "429 answers from Stripe seen by this process, by role.",
	}, []string{"role"})
	pauses := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pelguard_stripe_limiter_fleet_pauses_total",
		Help: "Fleet-wide pauses this process started after a 429 (the first report of a burst).",
	}, []string{"role"})
	redisErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pelguard_stripe_limiter_redis_errors_total",
		Help: "Redis calls of the limiter that failed (each starts or extends a fallback to the process's own share).",
	}, []string{"role"})
	shared := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pelguard_stripe_limiter_shared",
		Help: "1 while the limiter shares the account's rate through Redis, 0 while this process uses its own share.",
	}, []string{"role"})
	if reg != nil {
		reg.MustRegister(requests, fallback, wait, rateLimited, pauses, redisErrors, shared)
	}
	r := string(role)
	return &metrics{
		allowed: requests.WithLabelValues(r, "allowed"), delayed: requests.WithLabelValues(r, "delayed"),
		cancelled: requests.WithLabelValues(r, "cancelled"), fallback: fallback.WithLabelValues(r),
		wait: wait.WithLabelValues(r), rateLimited: rateLimited.WithLabelValues(r), pauses: pauses.WithLabelValues(r),
		redisErrors: redisErrors.WithLabelValues(r), shared: shared.WithLabelValues(r),
	}
}
