package stripesim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// Webhook is where the emulator POSTs its events, as a Stripe webhook
// endpoint subscribed to every event type would receive them.
type Webhook struct {
	// URL receives the events. Events are recorded (and listed by Events)
	// only while URL or Hold is set, so load tests and the drill without a
	// webhook pay nothing for them.
	URL string
	// Secret is the endpoint's signing secret ("whsec_…"), used exactly as
	// Stripe uses it: the HMAC key is the whole string.
	Secret string
	// Hold records events without delivering them, so a test delivers them
	// with DeliverEvents in the order it wants (out of order, twice, never).
	// With Hold and no URL events are only recorded, for inspection.
	Hold bool
	// Now is the signing clock, time.Now when nil. It is not the emulator's
	// clock: receivers check the signature's timestamp against their own
	// clock (stripe-go allows 5 minutes), and the emulator's clock is often
	// frozen in the past.
	Now func() time.Time
	// Client sends the deliveries; a client with a 10 s timeout when nil.
	Client *http.Client
}

// EventAPIVersion is every event's api_version: stripe-go v76's
// stripe.APIVersion, so webhook.ConstructEvent accepts the events without
// IgnoreAPIVersionMismatch.
const EventAPIVersion = stripe.APIVersion

// Event is a recorded event as the inspection API reports it.
type Event struct {
	ID       string
	Type     string // e.g. "payment_intent.succeeded"
	ObjectID string // data.object.id
	Created  time.Time
	// Payload is the exact JSON body delivered (and signed).
	Payload    []byte
	Deliveries []Delivery
}

// Delivery is one attempt to POST an event to the webhook URL.
type Delivery struct {
	EventID string    `json:"event"`
	At      time.Time `json:"at"`
	Status  int       `json:"status"`          // the receiver's HTTP status; 0 when no answer
	Err     string    `json:"error,omitempty"` // transport error or missing configuration
}

// ErrNoSuchEvent is DeliverEvents' answer for an unknown event id.
var ErrNoSuchEvent = errors.New("stripesim: no such event")

type event struct {
	Event
}

// eventLog keeps every event in creation order and the queue of events the
// delivery loop still has to send.
type eventLog struct {
	mu     sync.Mutex
	seq    uint64
	events []*event
	byID   map[string]*event
	queue  []*event
	wake   chan struct{}
}

func newEventLog() *eventLog {
	return &eventLog{byID: make(map[string]*event), wake: make(chan struct{}, 1)}
}

type eventJSON struct {
	ID         string `json:"id"`
	Object     string `json:"object"`
	Account    string `json:"account,omitempty"`
	APIVersion string `json:"api_version"`
	Created    int64  `json:"created"`
	Data       struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
	Livemode        bool `json:"livemode"`
	PendingWebhooks int  `json:"pending_webhooks"`
	Request         struct {
		ID             *string `json:"id"`
		IdempotencyKey *string `json:"idempotency_key"`
	} `json:"request"`
	Type string `json:"type"`
}

// emit records an event whose data.object is obj rendered now (events carry
// the object as it was when the event happened, not as it is at delivery).
// c is the API request that caused it, nil for admin calls (a bank's or a
// Dashboard user's doing). Callers may hold the store lock: the event log's
// lock is taken after it, never before.
func (s *Server) emit(typ, objectID string, obj any, livemode bool, c *apiCall) {
	wh := s.webhook.Load()
	if wh.URL == "" && !wh.Hold {
		return
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		s.log.Error("stripesim: rendering event object", "type", typ, "err", err)
		return
	}
	l := s.events
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	var ej eventJSON
	ej.ID = fmt.Sprintf("evt_sim%012d", l.seq)
	ej.Object, ej.APIVersion, ej.Created, ej.Livemode, ej.Type = "event", EventAPIVersion, s.Now().Unix(), livemode, typ
	ej.Data.Object = raw
	if wh.URL != "" {
		ej.PendingWebhooks = 1
	}
	if c != nil && c.idemKey != "" {
		ej.Request.IdempotencyKey = &c.idemKey
	}
	body, _ := json.Marshal(ej)
	e := &event{Event{ID: ej.ID, Type: typ, ObjectID: objectID, Created: time.Unix(ej.Created, 0).UTC(), Payload: body}}
	l.events = append(l.events, e)
	l.byID[e.ID] = e
	if wh.URL != "" && !wh.Hold {
		l.queue = append(l.queue, e)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// SetWebhook replaces the webhook configuration; events recorded while
// there was none (or while held) stay undelivered until DeliverEvents.
func (s *Server) SetWebhook(w Webhook) { s.webhook.Store(&w) }

// Events returns every recorded event, oldest first.
func (s *Server) Events() []Event {
	l := s.events
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Event, len(l.events))
	for i, e := range l.events {
		out[i] = e.Event
		out[i].Deliveries = append([]Delivery(nil), e.Deliveries...)
	}
	return out
}

// DeliverEvents POSTs the given events now, in the given order, and returns
// one Delivery per id: to replay an event (the same id and payload, freshly
// signed, as Stripe's retries are) or to deliver events out of order. A
// non-2xx answer is recorded, not retried.
func (s *Server) DeliverEvents(ctx context.Context, ids ...string) ([]Delivery, error) {
	evs := make([]*event, len(ids))
	s.events.mu.Lock()
	for i, id := range ids {
		evs[i] = s.events.byID[id]
		if evs[i] == nil {
			s.events.mu.Unlock()
			return nil, fmt.Errorf("delivering %s: %w", id, ErrNoSuchEvent)
		}
	}
	s.events.mu.Unlock()
	out := make([]Delivery, len(evs))
	for i, e := range evs {
		out[i] = s.deliver(ctx, e)
	}
	return out, nil
}

// SignPayload is the Stripe-Signature header Stripe sends for payload
// signed at t: "t=<unix>,v1=<hex HMAC-SHA256(secret, "<unix>.<payload>")>".
func SignPayload(payload []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(payload)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

func (s *Server) deliver(ctx context.Context, e *event) Delivery {
	d := Delivery{EventID: e.ID, At: s.Now()}
	wh := s.webhook.Load()
	if wh.URL == "" {
		d.Err = "no webhook URL configured"
		s.recordDelivery(e, d)
		return d
	}
	now := time.Now
	if wh.Now != nil {
		now = wh.Now
	}
	hc := wh.Client
	if hc == nil {
		hc = s.webhookClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.URL, bytes.NewReader(e.Payload))
	if err == nil {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
		req.Header.Set("Stripe-Signature", SignPayload(e.Payload, wh.Secret, now()))
		var resp *http.Response
		resp, err = hc.Do(req)
		if err == nil {
			d.Status = resp.StatusCode
			_ = resp.Body.Close()
		}
	}
	if err != nil {
		d.Err = err.Error()
	}
	s.recordDelivery(e, d)
	return d
}

func (s *Server) recordDelivery(e *event, d Delivery) {
	s.events.mu.Lock()
	e.Deliveries = append(e.Deliveries, d)
	s.events.mu.Unlock()
}

// runDeliveries sends queued events one at a time, in creation order, until
// the server closes.
func (s *Server) runDeliveries(ctx context.Context) {
	defer close(s.deliveriesDone)
	l := s.events
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		for {
			l.mu.Lock()
			if len(l.queue) == 0 {
				l.mu.Unlock()
				break
			}
			e := l.queue[0]
			l.queue = l.queue[1:]
			l.mu.Unlock()
			s.deliver(ctx, e)
		}
	}
}
