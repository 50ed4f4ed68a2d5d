package alerts

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/pelguard/pelguard/clock"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Config.
const (
	DefaultQueueSize        = 256
	DefaultRatePerChannel   = 1.0 // Slack allows about one message per second per channel
	DefaultMaxAttempts      = 5
	DefaultBaseBackoff      = 500 * time.Millisecond
	DefaultMaxBackoff       = 30 * time.Second
	DefaultMaxRetryAfter    = 5 * time.Minute
	DefaultDedupeTTL        = 10 * time.Minute
	DefaultMaxThreadReplies = 50
	DefaultRequestTimeout   = 10 * time.Second
	DefaultAPIURL           = "https://slack.com/api"
)

// Config configures a notifier. The zero value (plus nothing else) gives the
// log-only notifier; WebhookURL gives the incoming-webhook notifier; BotToken
// and Channel give the bot notifier, which can thread replies and is chosen
// when both are set.
type Config struct {
	// WebhookURL is the incoming webhook (SLACK_WEBHOOK_URL). It is a
	// credential: it is never logged.
	WebhookURL string
	// BotToken (SLACK_BOT_TOKEN, xoxb-…) and Channel (SLACK_CHANNEL, a
	// channel ID the bot is a member of) select the Web API.
	BotToken string
	Channel  string
	// APIURL is the Web API base, without the trailing slash; tests point it
	// at slacktest.Recorder.APIURL.
	APIURL string

	// QueueSize bounds the alerts waiting for delivery (default 256).
	QueueSize int
	// RatePerChannel is the messages per second sent to one channel
	// (default 1, Slack's documented limit).
	RatePerChannel float64
	// MaxAttempts is how many times one message is tried (default 5).
	MaxAttempts int
	// BaseBackoff and MaxBackoff bound the exponential backoff between
	// attempts (defaults 500 ms and 30 s); jitter spreads each wait.
	BaseBackoff time.Duration
	MaxBackoff  time.Duration
	// MaxRetryAfter caps a 429's Retry-After so that a wild value cannot
	// stall alerting (default 5 min).
	MaxRetryAfter time.Duration
	// DedupeTTL is how long an alert's Fingerprint suppresses repeats
	// (default 10 min).
	DedupeTTL time.Duration
	// MaxThreadReplies caps the replies posted under one message; at one
	// message per second a 500-finding run would hold the queue for minutes
	// (default 50, then "… and N more").
	MaxThreadReplies int
	// RequestTimeout bounds one HTTP attempt (default 10 s).
	RequestTimeout time.Duration
	// HTTPClient is used for every request (default: a client with
	// RequestTimeout).
	HTTPClient *http.Client

	Logger *slog.Logger
	Clock  clock.Clock
	// Registerer, when set, receives the pelguard_alerts_* metrics.
	Registerer prometheus.Registerer
}

// SlackConfig is the Config the Slack constructors take; the same type, so
// that New, NewSlackWebhook and NewSlackBot share one set of settings.
type SlackConfig = Config

// LogValue keeps the webhook URL and the token out of logs when a Config is
// logged whole.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Bool("webhook_url_set", c.WebhookURL != ""),
		slog.Bool("bot_token_set", c.BotToken != ""),
		slog.String("channel", c.Channel),
		slog.Int("queue_size", c.QueueSize),
	)
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.RatePerChannel = cmp.Or(c.RatePerChannel, DefaultRatePerChannel)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BaseBackoff = cmp.Or(c.BaseBackoff, DefaultBaseBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.DedupeTTL = cmp.Or(c.DedupeTTL, DefaultDedupeTTL)
	c.MaxThreadReplies = cmp.Or(c.MaxThreadReplies, DefaultMaxThreadReplies)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.APIURL = strings.TrimSuffix(cmp.Or(c.APIURL, DefaultAPIURL), "/")
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: c.RequestTimeout}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// Validate reports a configuration that cannot work. Its errors never
// include the webhook URL or the token.
func (c Config) Validate() error {
	var errs []error
	if c.BotToken != "" && c.Channel == "" {
		errs = append(errs, errors.New("SLACK_BOT_TOKEN is set but SLACK_CHANNEL is empty: "+
			"set SLACK_CHANNEL to the ID of a channel the bot is a member of (e.g. C0123456789), "+
			"or unset SLACK_BOT_TOKEN to use SLACK_WEBHOOK_URL"))
	}
	if c.Channel != "" && c.BotToken == "" && c.WebhookURL == "" {
		errs = append(errs, errors.New("SLACK_CHANNEL is set but SLACK_BOT_TOKEN is empty: "+
			"set SLACK_BOT_TOKEN (xoxb-…) to post to the channel"))
	}
	if c.BotToken != "" && strings.ContainsAny(c.BotToken, " \t\r\n") {
		errs = append(errs, errors.New("SLACK_BOT_TOKEN contains whitespace: check how it was exported"))
	}
	if c.WebhookURL != "" {
		if err := checkURL(c.WebhookURL); err != nil {
			errs = append(errs, fmt.Errorf("SLACK_WEBHOOK_URL: %w", err))
		}
	}
	if c.APIURL != "" {
		if err := checkURL(c.APIURL); err != nil {
			errs = append(errs, fmt.Errorf("slack API URL: %w", err))
		}
	}
	if c.QueueSize < 0 || c.RatePerChannel < 0 || c.MaxAttempts < 0 || c.BaseBackoff < 0 ||
		c.MaxBackoff < 0 || c.DedupeTTL < 0 || c.MaxThreadReplies < 0 || c.RequestTimeout < 0 {
		errs = append(errs, errors.New("queue size, rate, attempts, backoffs, TTL and timeouts must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("alerts: invalid config: %w", err)
	}
	return nil
}

// checkURL accepts https, and http only on loopback (tests). The URL itself
// is kept out of the error: a webhook URL is a credential.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid URL")
	}
	switch {
	case u.Host == "":
		return errors.New("URL has no host")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopback(u.Hostname()):
		return nil
	default:
		return errors.New("URL must use https (http is accepted on loopback only)")
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// New validates cfg and returns the notifier it selects: the bot when
// BotToken is set, else the webhook when WebhookURL is set, else the
// log-only notifier.
func New(cfg Config) (Notifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.BotToken != "":
		return NewSlackBot(cfg)
	case cfg.WebhookURL != "":
		return NewSlackWebhook(cfg)
	default:
		cfg = cfg.withDefaults()
		m, err := newMetrics(cfg.Registerer)
		if err != nil {
			return nil, err
		}
		cfg.Logger.Info("alerts: no SLACK_WEBHOOK_URL or SLACK_BOT_TOKEN; alerts go to the log only")
		return newLog(cfg.Logger, m), nil
	}
}

// FromEnv fills WebhookURL, BotToken and Channel from SLACK_WEBHOOK_URL,
// SLACK_BOT_TOKEN and SLACK_CHANNEL where cfg leaves them empty (flags win),
// then calls New.
func FromEnv(cfg Config) (Notifier, error) {
	return New(withEnv(cfg, os.Getenv))
}

func withEnv(cfg Config, getenv func(string) string) Config {
	cfg.WebhookURL = cmp.Or(cfg.WebhookURL, strings.TrimSpace(getenv("SLACK_WEBHOOK_URL")))
	cfg.BotToken = cmp.Or(cfg.BotToken, strings.TrimSpace(getenv("SLACK_BOT_TOKEN")))
	cfg.Channel = cmp.Or(cfg.Channel, strings.TrimSpace(getenv("SLACK_CHANNEL")))
	return cfg
}
