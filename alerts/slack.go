package alerts

import (
	"context"
	"errors"
	"fmt"
	"github.com/pelguard/pelguard/clock"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"
	"golang.org/x/time/rate"
)

// sender posts one rendered message; threadTS, when set, makes it a reply.
// It returns the message's ts when the API tells it (the bot API does, an
// incoming webhook does not).
type sender interface {
	post(ctx context.Context, m message, threadTS string) (ts string, err error)
	canThread() bool
	channel() string
}

// Slack is the Slack notifier: a bounded queue and one delivery worker.
type Slack struct {
	cfg    Config
	send   sender
	log    *slog.Logger
	clock  clock.Clock
	m      *metrics
	queue  chan Alert
	dedupe *dedupe

	limMu    sync.Mutex
	limiters map[string]*rate.Limiter

	// mu guards closed against Notify racing with Close's close(queue).
	mu        sync.RWMutex
	closed    bool
	closeOnce sync.Once

	ctx    context.Context // cancelled when Close's ctx ends first
	cancel context.CancelFunc
	done   chan struct{}

	dropLog   dropLogger
	ownClient bool // cfg.HTTPClient was built by withDefaults
}

// NewSlackWebhook returns a notifier posting to cfg.WebhookURL.
//
// It uses slack.PostWebhookCustomHTTPContext (PostWebhookContext with
// cfg.HTTPClient instead of http.DefaultClient, which has no timeout). In
// slack-go v0.35 a webhook 429 that carries Retry-After comes back as
// *slack.RateLimitedError, like the Web API's, so both are handled in one
// place; a 429 without the header is a slack.StatusCodeError and backs off.
func NewSlackWebhook(cfg SlackConfig) (*Slack, error) {
	if cfg.WebhookURL == "" {
		return nil, errors.New("alerts: NewSlackWebhook: SLACK_WEBHOOK_URL is empty")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	own := cfg.HTTPClient == nil
	cfg = cfg.withDefaults()
	return start(cfg, own, &webhookSender{url: cfg.WebhookURL, client: cfg.HTTPClient})
}

// NewSlackBot returns a notifier posting to cfg.Channel with cfg.BotToken
// through chat.postMessage; it can thread replies under a message.
func NewSlackBot(cfg SlackConfig) (*Slack, error) {
	if cfg.BotToken == "" {
		return nil, errors.New("alerts: NewSlackBot: SLACK_BOT_TOKEN is empty")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	own := cfg.HTTPClient == nil
	cfg = cfg.withDefaults()
	api := slack.New(cfg.BotToken, slack.OptionAPIURL(cfg.APIURL+"/"), slack.OptionHTTPClient(cfg.HTTPClient))
	return start(cfg, own, &botSender{api: api, ch: cfg.Channel})
}

func start(cfg Config, ownClient bool, s sender) (*Slack, error) {
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	// The worker's context is not derived from a caller's: the notifier
	// outlives the call that built it, and Close decides when it ends.
	ctx, cancel := context.WithCancel(context.Background())
	n := &Slack{
		cfg:      cfg,
		send:     s,
		log:      cfg.Logger,
		clock:    cfg.Clock,
		m:        m,
		queue:    make(chan Alert, cfg.QueueSize),
		dedupe:   newDedupe(cfg.DedupeTTL),
		limiters: map[string]*rate.Limiter{},
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),

		ownClient: ownClient,
	}
	go n.run()
	return n, nil
}

// Notify queues a; it never blocks. See Notifier.
func (n *Slack) Notify(a Alert) {
	now := n.clock.Now()
	if a.Fingerprint != "" && !n.dedupe.claim(a.Fingerprint, now) {
		n.m.incDropped(DropDeduped)
		return
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		n.drop(a, DropClosed, now)
		return
	}
	select {
	case n.queue <- a:
	default:
		n.drop(a, DropQueueFull, now)
	}
}

func (n *Slack) drop(a Alert, reason string, now time.Time) {
	if a.Fingerprint != "" {
		n.dedupe.forget(a.Fingerprint) // a later copy may still get through
	}
	n.m.incDropped(reason)
	n.dropLog.log(n.log, now, a, reason)
}

// Close stops accepting alerts and waits for the queue to drain. When ctx
// ends first, the message in flight is abandoned (counted as failed), what
// is still queued is counted as dropped (reason shutdown), and ctx's error
// is returned.
// Calling Close again waits again; it is safe.
func (n *Slack) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		close(n.queue)
		n.mu.Unlock()
	})
	defer n.closeIdle()
	select {
	case <-n.done:
		n.cancel()
		return nil
	case <-ctx.Done():
		n.cancel()
		<-n.done // quick: every wait in the worker watches n.ctx
		return fmt.Errorf("alerts: closing before the queue drained: %w", ctx.Err())
	}
}

// closeIdle releases the keep-alive connections of a client the notifier
// built itself, so Close leaves no goroutine behind.
func (n *Slack) closeIdle() {
	if n.ownClient {
		n.cfg.HTTPClient.CloseIdleConnections()
	}
}

// Stats returns the counters.
func (n *Slack) Stats() Stats { return n.m.stats() }

func (n *Slack) run() {
	defer close(n.done)
	for a := range n.queue {
		if n.ctx.Err() != nil {
			n.m.incDropped(DropShutdown)
			continue
		}
		n.deliver(n.ctx, a)
	}
}

// deliver sends a, then its items as thread replies when asked and possible.
func (n *Slack) deliver(ctx context.Context, a Alert) {
	threaded := a.ThreadItems && n.send.canThread()
	ts, err := n.sendWithRetry(ctx, render(a, threaded), "")
	if err != nil {
		if a.Fingerprint != "" {
			n.dedupe.forget(a.Fingerprint)
		}
		n.m.incFailed(a.Kind)
		n.log.Error("alerts: giving up on alert", slog.String("kind", string(a.Kind)),
			slog.String("title", Redact(a.Title)), slog.String("error", Redact(err.Error())))
		return
	}
	n.m.incSent(a.Kind)
	if !threaded || ts == "" || len(a.Items) == 0 {
		return
	}
	replies := a.Items[:min(len(a.Items), n.cfg.MaxThreadReplies)]
	for i, it := range replies {
		reply := Alert{Kind: a.Kind, Items: []Item{it}}
		if _, err := n.sendWithRetry(ctx, renderReply(reply), ts); err != nil {
			n.log.Error("alerts: giving up on thread replies", slog.String("kind", string(a.Kind)),
				slog.Int("posted", i), slog.Int("items", len(a.Items)), slog.String("error", Redact(err.Error())))
			return
		}
	}
	if rest := len(a.Items) - len(replies); rest > 0 {
		more := fmt.Sprintf("… and %d more not posted here (see the auditor's output)", rest)
		if _, err := n.sendWithRetry(ctx, message{Text: more, Blocks: []slack.Block{section(more)}}, ts); err != nil {
			n.log.Error("alerts: posting the thread's last reply", slog.String("error", Redact(err.Error())))
		}
	}
}

// renderReply is one item as a thread reply: a single section, with the
// same text as the fallback.
func renderReply(a Alert) message {
	t := cutText(Redact(a.Items[0].Text), maxSectionText)
	return message{Text: t, Blocks: []slack.Block{section(t)}}
}

// sendWithRetry posts m, waiting for the channel's rate limit before every
// attempt, retrying transient failures until MaxAttempts.
func (n *Slack) sendWithRetry(ctx context.Context, m message, threadTS string) (string, error) {
	for attempt := 1; ; attempt++ {
		if err := n.waitRate(ctx, n.send.channel()); err != nil {
			return "", err
		}
		actx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
		ts, err := n.send.post(actx, m, threadTS)
		cancel()
		if err == nil {
			return ts, nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("posting to slack (attempt %d): %w", attempt, ctx.Err())
		}
		wait, retry := n.classify(err, attempt)
		if !retry {
			return "", fmt.Errorf("posting to slack (attempt %d, not retryable): %w", attempt, err)
		}
		if attempt >= n.cfg.MaxAttempts {
			return "", fmt.Errorf("posting to slack: gave up after %d attempts: %w", attempt, err)
		}
		n.m.nRetries.Add(1)
		n.log.Warn("alerts: slack post failed, retrying", slog.Int("attempt", attempt),
			slog.Duration("wait", wait), slog.String("error", Redact(err.Error())))
		if err := n.sleep(ctx, wait); err != nil {
			return "", fmt.Errorf("waiting to retry: %w", err)
		}
	}
}

// retryableAPIErrors are chat.postMessage errors that a later attempt can
// cure; every other API error (invalid_auth, channel_not_found, not_in_channel,
// missing_scope, ...) needs a human, so retrying only delays the log line.
var retryableAPIErrors = map[string]bool{
	"ratelimited": true, "rate_limited": true, "internal_error": true, "fatal_error": true,
	"service_unavailable": true, "request_timeout": true,
}

// classify decides whether err is worth another attempt and how long to wait.
func (n *Slack) classify(err error, attempt int) (time.Duration, bool) {
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		if rl.RetryAfter <= 0 {
			return n.backoff(attempt), true
		}
		return min(rl.RetryAfter, n.cfg.MaxRetryAfter), true
	}
	var sc slack.StatusCodeError
	if errors.As(err, &sc) {
		code := sc.HTTPStatusCode()
		return n.backoff(attempt), code == http.StatusTooManyRequests || code >= 500
	}
	var api slack.SlackErrorResponse
	if errors.As(err, &api) {
		return n.backoff(attempt), retryableAPIErrors[api.Err]
	}
	// Network errors, timeouts, a body cut short: transient until shown otherwise.
	return n.backoff(attempt), true
}

// backoff is exponential from BaseBackoff, capped at MaxBackoff, with "equal
// jitter" (half fixed, half random) so that several processes that failed
// together do not retry together.
func (n *Slack) backoff(attempt int) time.Duration {
	d := n.cfg.BaseBackoff
	for i := 1; i < attempt && d < n.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, n.cfg.MaxBackoff)
	half := d / 2
	return half + rand.N(half+1)
}

// waitRate holds the worker until the channel's limiter allows a message.
// The limiter is driven by the injected clock, so tests do not wait.
func (n *Slack) waitRate(ctx context.Context, ch string) error {
	n.limMu.Lock()
	lim, ok := n.limiters[ch]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(n.cfg.RatePerChannel), 1)
		n.limiters[ch] = lim
	}
	n.limMu.Unlock()
	now := n.clock.Now()
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return errors.New("rate limiter refused a reservation")
	}
	if err := n.sleep(ctx, r.DelayFrom(now)); err != nil {
		r.CancelAt(n.clock.Now())
		return fmt.Errorf("waiting for the channel's rate limit: %w", err)
	}
	return nil
}

func (n *Slack) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-clock.After(n.clock, d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type webhookSender struct {
	url    string
	client *http.Client
}

func (w *webhookSender) post(ctx context.Context, m message, threadTS string) (string, error) {
	msg := &slack.WebhookMessage{Text: m.Text, Blocks: &slack.Blocks{BlockSet: m.Blocks}, ThreadTimestamp: threadTS}
	if err := slack.PostWebhookCustomHTTPContext(ctx, w.url, w.client, msg); err != nil {
		// net/http puts the URL, a credential, in network errors. Redact
		// catches hooks.slack.com; this catches any other host (a proxy, a
		// test server) while errors.As still sees the slack-go error.
		return "", &scrubbedError{
			msg: "posting to the incoming webhook: " + strings.ReplaceAll(err.Error(), w.url, "[webhook URL]"),
			err: err,
		}
	}
	return "", nil
}

// scrubbedError is err with a message that no longer shows a credential.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func (w *webhookSender) canThread() bool { return false }
func (w *webhookSender) channel() string { return "webhook" }

type botSender struct {
	api *slack.Client
	ch  string
}

func (b *botSender) post(ctx context.Context, m message, threadTS string) (string, error) {
	opts := []slack.MsgOption{
		slack.MsgOptionText(m.Text, false),
		slack.MsgOptionBlocks(m.Blocks...),
		slack.MsgOptionDisableLinkUnfurl(),
	}
	if threadTS != "" {
		opts = append(opts, slack.MsgOptionTS(threadTS))
	}
	_, ts, err := b.api.PostMessageContext(ctx, b.ch, opts...)
	if err != nil {
		return "", fmt.Errorf("chat.postMessage: %w", err)
	}
	return ts, nil
}

func (b *botSender) canThread() bool { return true }
func (b *botSender) channel() string { return b.ch }
