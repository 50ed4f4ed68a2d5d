package consolecli

import (
	"flag"
	"github.com/pelguard/pelguard/consumer"
	"net/url"
	"strings"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/console"
	"github.com/pelguard/pelguard/reaper"
)

// LiveOptions are the flags of the live pages: the reaper's policy the PEL
// page judges entries by (the reaper's own flags and environment, so one
// environment file serves both), the refresh and Prometheus.
type LiveOptions struct {
	ReaperMinIdle       time.Duration
	ReaperMaxDeliveries int64
	StoppedConsumers    string
	MaxAmountCents      int64
	StrictFields        bool
	ExternalLedger      string
	ExternalMaxCall     time.Duration
	Refresh             time.Duration
	PrometheusURL       string
	Namespace           string
	ConsumerIdle        time.Duration
}

func (o *LiveOptions) register(fs *flag.FlagSet) {
	fs.DurationVar(&o.ReaperMinIdle, "reaper-min-idle", cli.EnvDuration("PELGUARD_MIN_IDLE", reaper.DefaultMinIdle), "the reaper's --min-idle, for the PEL page's verdicts [PELGUARD_MIN_IDLE]")
	fs.Int64Var(&o.ReaperMaxDeliveries, "reaper-max-deliveries", reaper.DefaultMaxDeliveries, "the reaper's --max-deliveries, for the PEL page's verdicts")
	fs.StringVar(&o.StoppedConsumers, "stopped-consumers", cli.Env("PELGUARD_STOPPED_CONSUMERS", ""), "the reaper's --stopped-consumers, for the PEL page's verdicts [PELGUARD_STOPPED_CONSUMERS]")
	fs.Int64Var(&o.MaxAmountCents, "max-amount-cents", event.DefaultMaxAmountCents, "the reaper's --max-amount-cents, for the PEL page's verdicts")
	fs.BoolVar(&o.StrictFields, "strict-fields", false, "the reaper's --strict-fields, for the PEL page's verdicts")
	fs.StringVar(&o.ExternalLedger, "external-ledger", cli.Env("PELGUARD_EXTERNAL_LEDGER", ""), "the reaper's --external-ledger, for the PEL page's verdicts [PELGUARD_EXTERNAL_LEDGER]")
	fs.DurationVar(&o.ExternalMaxCall, "external-max-call", cli.EnvDuration("PELGUARD_EXTERNAL_MAX_CALL", 0), "the reaper's --external-max-call, with --external-ledger [PELGUARD_EXTERNAL_MAX_CALL]")
	fs.StringVar(&o.Namespace, "namespace", cli.Env("PELGUARD_NAMESPACE", consumer.DefaultNamespace), "the streams' namespace (part of every idempotency key and meter-event identifier), for the PEL page's verdicts; the console refuses to start with another one than the streams record [PELGUARD_NAMESPACE]")
	fs.DurationVar(&o.ConsumerIdle, "consumer-idle", reaper.DefaultConsumerIdle, "the reaper's --consumer-idle: a consumer gone this long (no heartbeat, no read) and holding nothing leaves the consumers panel (0: list every one)")
	fs.DurationVar(&o.Refresh, "refresh", console.DefaultRefresh, "how often the overview and the PEL page reload themselves; 0 never")
	fs.StringVar(&o.PrometheusURL, "prometheus-url", cli.Env("PELGUARD_PROMETHEUS_URL", ""), "Prometheus's base URL (http://prometheus:9090): the overview then shows the fleet's Stripe limiter (rate by role, waits, 429s) [PELGUARD_PROMETHEUS_URL]")
}

// validate checks the flags before anything is built.
func (o *LiveOptions) validate() error {
	switch {
	case o.ReaperMinIdle < time.Millisecond:
		return cli.Usagef("--reaper-min-idle %s must be at least 1ms (give the reaper's --min-idle)", o.ReaperMinIdle)
	case o.ReaperMaxDeliveries < 1:
		return cli.Usagef("--reaper-max-deliveries %d must be at least 1 (give the reaper's --max-deliveries)", o.ReaperMaxDeliveries)
	case o.ConsumerIdle < 0:
		return cli.Usagef("--consumer-idle %s must not be negative (0 lists every consumer)", o.ConsumerIdle)
	case o.Refresh < 0:
		return cli.Usagef("--refresh %s must not be negative (0 turns it off)", o.Refresh)
	}
	if o.PrometheusURL != "" {
		u, err := url.Parse(o.PrometheusURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cli.Usagef("--prometheus-url %q: want Prometheus's base URL, e.g. http://prometheus:9090", o.PrometheusURL)
		}
	}
	return nil
}

// apply sets the console's live settings.
func (o *LiveOptions) apply(cfg *console.Config) {
	var stopped []string
	for n := range strings.SplitSeq(o.StoppedConsumers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			stopped = append(stopped, n)
		}
	}
	cfg.Reaper = console.ReaperPolicy{MinIdle: o.ReaperMinIdle, MaxDeliveries: o.ReaperMaxDeliveries, StoppedConsumers: stopped,
		Rules: event.Rules{MaxAmountCents: o.MaxAmountCents, StrictFields: o.StrictFields}, ExternalLedger: o.ExternalLedger,
		ExternalMaxCall: o.ExternalMaxCall, Namespace: o.Namespace}
	cfg.ConsumerIdle = o.ConsumerIdle
	if o.ConsumerIdle == 0 {
		cfg.ConsumerIdle = -1
	}
	cfg.Refresh = o.Refresh
	if o.Refresh == 0 {
		cfg.Refresh = -1
	}
	cfg.PrometheusURL = strings.TrimRight(o.PrometheusURL, "/")
}
