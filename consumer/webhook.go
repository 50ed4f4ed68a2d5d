package consumer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/ledger"
)

// WebhookPath is where the webhook handler expects Stripe's POSTs.
const WebhookPath = "/stripe/webhook"

// Webhook defaults.
const (
	// DefaultWebhookTolerance is how old a signature's timestamp may be
	// (stripe-go's default, Stripe's recommendation).
	DefaultWebhookTolerance = webhook.DefaultTolerance
	maxWebhookBody          = 1 << 20
)

// WebhookConfig configures WebhookHandler: Stripe's events settle money in
// motion faster than polling. Polling alone is enough; the webhook only
// shortens the wait.
type WebhookConfig struct {
	DB     *pgxpool.Pool // required
	Schema string
	// Secret is the endpoint's signing secret (whsec_…). Never logged.
	Secret string
	// Tolerance bounds the age of a signature (DefaultWebhookTolerance).
	Tolerance time.Duration
	// Retry decides the retry of a failed debit, as in the consumer.
	Retry    RetryPolicy
	Notifier alerts.Notifier
	Logger   *slog.Logger
	Clock    clock.Clock
	Metrics  *WebhookMetrics
	// Witness is the process's ledger witness (Config.Witness): the
	// settlements it records bump it.
	Witness LedgerWitness
}

// WebhookMetrics are the webhook handler's series; nil records nothing.
type WebhookMetrics struct {
	events *prometheus.CounterVec
	last   prometheus.Gauge
}

// Webhook results, the result label of pelguard_webhook_events_total.
const (
	WebhookApplied      = "applied"       // the event settled a processing row
	WebhookDuplicate    = "duplicate"     // the event id was applied before
	WebhookIgnored      = "ignored"       // not about a row in motion (or not final)
	WebhookBadSignature = "bad_signature" // 400: not from Stripe, or too old
	WebhookBadRequest   = "bad_request"   // 400/405/413: not an event
	WebhookError        = "error"         // 500: Postgres failed; Stripe retries
)

// NewWebhookMetrics registers the webhook series on reg.
func NewWebhookMetrics(reg prometheus.Registerer) *WebhookMetrics {
	m := &WebhookMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pelguard_webhook_events_total",
			Help: "Stripe webhook deliveries, by result (applied, duplicate, ignored, bad_signature, bad_request, error).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pelguard_webhook_last_event_timestamp_seconds",
			Help: "When the last verified Stripe event arrived (Unix seconds).",
		}),
	}
	for _, r := range []string{WebhookApplied, WebhookDuplicate, WebhookIgnored, WebhookBadSignature, WebhookBadRequest, WebhookError} {
		m.events.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.last)
	}
	return m
}

func (m *WebhookMetrics) count(result string, verified bool, now time.Time) {
	if m == nil {
		return
	}
	m.events.WithLabelValues(result).Inc()
	if verified {
		m.last.Set(float64(now.Unix()))
	}
}

// ErrNoWebhookSecret is WebhookHandler's answer to a config without Secret.
var ErrNoWebhookSecret = errors.New("consumer: the webhook signing secret (PELGUARD_STRIPE_WEBHOOK_SECRET, whsec_…) is required")

// WebhookHandler serves Stripe's webhook POSTs: it verifies
// Stripe-Signature with stripe-go's webhook package, then settles the
// processing row the event's charge or intent belongs to (the same
// settleCharge the consumer's polls use), and answers 2xx only after that
// ledger write committed. An event id seen before is answered at once; the
// settle itself is fenced, so a replay of an event whose id was not yet
// recorded (a crash between the two writes) changes nothing either. The
// account's webhook API version may differ from stripe-go's: the version
// check is skipped and only fields stable across versions are read (ids,
// status, failure codes).
func WebhookHandler(cfg WebhookConfig) (http.Handler, error) {
	if cfg.DB == nil {
		return nil, errors.New("consumer: the webhook needs a Postgres pool (DB)")
	}
	if !strings.HasPrefix(cfg.Secret, "whsec_") {
		return nil, ErrNoWebhookSecret
	}
	cfg.Tolerance = cmp.Or(cfg.Tolerance, DefaultWebhookTolerance)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Notifier == nil {
		cfg.Notifier = alerts.NewLog(cfg.Logger)
	}
	l := ledger.New(cfg.DB, cfg.Schema, cfg.Clock)
	if cfg.Witness != nil {
		l.SetWitness(cfg.Witness)
	}
	return &webhookHandler{cfg: cfg, ledger: l}, nil
}

type webhookHandler struct {
	cfg    WebhookConfig
	ledger *ledger.Ledger
	// pruned is when this handler last pruned webhook_events (Unix ns).
	pruned atomic.Int64
}

// Remembered webhook events are kept WebhookEventsKept (Stripe retries an
// event for up to three days), pruned at most hourly by the handler that
// records them, up to webhookPruneBatch rows at a time.
const (
	WebhookEventsKept = 30 * 24 * time.Hour
	webhookPruneEvery = time.Hour
	webhookPruneBatch = 10_000
)

// prune deletes remembered events older than WebhookEventsKept, at most
// once per webhookPruneEvery per process; a failure is logged and tried
// again at the next event.
func (h *webhookHandler) prune(ctx context.Context) {
	now := h.cfg.Clock.Now()
	last := h.pruned.Load()
	if now.Sub(time.Unix(0, last)) < webhookPruneEvery || !h.pruned.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	n, err := h.ledger.PruneWebhookEvents(ctx, now.Add(-WebhookEventsKept), webhookPruneBatch)
	switch {
	case err != nil:
		h.pruned.Store(last)
		h.cfg.Logger.WarnContext(ctx, "pruning remembered webhook events", "err", err)
	case n > 0:
		h.cfg.Logger.InfoContext(ctx, "pruned remembered webhook events", "events", n, "older_than", WebhookEventsKept.String())
	}
}

// hookObject is the part of a charge or PaymentIntent an event carries
// that settles a row: the same names in every API version.
type hookObject struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Status         string          `json:"status"`
	FailureCode    string          `json:"failure_code"`
	FailureMessage string          `json:"failure_message"`
	PaymentIntent  json.RawMessage `json:"payment_intent"` // charge: an id (or an expanded object)
	LatestCharge   json.RawMessage `json:"latest_charge"`  // intent: an id (or an expanded object)
	LastError      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"last_payment_error"`
}

// refID reads an id that may be a string or an expanded {"id": …}.
func refID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.ID
}

func (h *webhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := h.cfg.Clock.Now()
	reply := func(code int, result string, verified bool) {
		h.cfg.Metrics.count(result, verified, now)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, `{"result":"`+result+`"}`)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reply(http.StatusMethodNotAllowed, WebhookBadRequest, false)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
	if err != nil {
		reply(http.StatusRequestEntityTooLarge, WebhookBadRequest, false)
		return
	}
	ev, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), h.cfg.Secret,
		webhook.ConstructEventOptions{Tolerance: h.cfg.Tolerance, IgnoreAPIVersionMismatch: true})
	if err != nil {
		// err names what failed (no signature, bad signature, too old);
		// it never contains the secret.
		h.cfg.Logger.WarnContext(r.Context(), "webhook refused", slog.String("reason", err.Error()))
		reply(http.StatusBadRequest, WebhookBadSignature, false)
		return
	}
	var obj hookObject
	if ev.Data == nil || json.Unmarshal(ev.Data.Raw, &obj) != nil || obj.ID == "" {
		reply(http.StatusBadRequest, WebhookBadRequest, true)
		return
	}
	log := h.cfg.Logger.With(slog.String("event", ev.ID), slog.String("type", string(ev.Type)), slog.String("object", obj.ID))
	result, err := h.apply(r, ev.ID, string(ev.Type), obj)
	if err != nil {
		log.ErrorContext(r.Context(), "webhook event not applied; Stripe will deliver it again", slog.Any("error", err))
		reply(http.StatusInternalServerError, WebhookError, true)
		return
	}
	log.InfoContext(r.Context(), "webhook event", slog.String("result", result))
	reply(http.StatusOK, result, true)
}

// apply settles the row the event is about, then records the event id.
func (h *webhookHandler) apply(r *http.Request, id, typ string, obj hookObject) (string, error) {
	ctx := r.Context()
	seen, err := h.ledger.WebhookEventSeen(ctx, id)
	if err != nil || seen {
		return WebhookDuplicate, err
	}
	result := WebhookIgnored
	chargeID, intentID, status, code, msg := obj.ID, refID(obj.PaymentIntent), obj.Status, obj.FailureCode, obj.FailureMessage
	if obj.Object == "payment_intent" {
		chargeID, intentID = refID(obj.LatestCharge), obj.ID
		switch status {
		case "succeeded":
		case "requires_payment_method": // payment_failed: the debit came back
			status = "failed"
			if obj.LastError != nil {
				code, msg = obj.LastError.Code, obj.LastError.Message
			}
		default:
			status = "" // processing, requires_action, canceled: nothing final
		}
	}
	if (status == "succeeded" || status == "failed") && chargeID != "" {
		rec, err := h.ledger.ByPaymentRef(ctx, chargeID, intentID)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
		case err != nil:
			return "", err
		case rec.Status == ledger.StatusProcessing && rec.ChargeID == chargeID:
			_, settled, err := settleCharge(ctx, h.ledger, h.cfg.Notifier, h.cfg.Retry, rec, status, code, msg)
			if err != nil {
				return "", err
			}
			if settled {
				result = WebhookApplied
			}
		}
	}
	if err := h.ledger.RecordWebhookEvent(ctx, id, typ, obj.ID, result); err != nil {
		return result, err
	}
	h.prune(ctx)
	return result, nil
}
