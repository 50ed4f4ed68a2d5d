package naive

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/stripeapi"
)

// The seed's consumer loop with stripe.billing.MeterEvent.create in place
// of stripe.Charge.create: what a team that moves usage to Stripe Billing
// Meters writes first. Same loop, same bugs (ack after the call, no ledger,
// the Monitor's XAUTOCLAIM reusable as it is), in two variants:
//
//   - no identifier (MeterConsumerConfig.Identifier false): Stripe makes
//     one up per call, so every re-send (a reclaim while in flight, a
//     re-read batch, an AOF rollback) is counted again;
//   - a deterministic identifier (the event's event_id) but no ledger: the
//     fix teams ship. Stripe refuses a repeated identifier, and the
//     consumer takes that refusal as delivered and acks, but only within
//     Stripe's window of at least 24 h: an entry redelivered later (left
//     pending by a lost reply, say) is counted a second time, and nothing
//     remembers that it was sent.

// MeterEvent is a usage event as the stream carries it (event.MeterEvent's
// JSON), decoded with json.Unmarshal and not validated, as the seed does.
type MeterEvent struct {
	EventName        string    `json:"event_name"`
	CustomerID       string    `json:"customer_id"`
	StripeCustomerID string    `json:"stripe_customer_id"`
	Value            int64     `json:"value"`
	Timestamp        time.Time `json:"timestamp"`
	EventID          string    `json:"event_id"`
}

// MeterSender is the part of the Stripe adapter the naive meter consumer
// calls; *stripeapi.Client has it.
type MeterSender interface {
	SendMeterEvent(ctx context.Context, ev stripeapi.MeterEvent) (stripeapi.MeterEventResult, error)
}

// MeterConsumerConfig configures a naive MeterConsumer.
type MeterConsumerConfig struct {
	Redis  redis.UniversalClient
	Stream string
	Group  string
	Name   string
	// Count is XREADGROUP's COUNT. Default 1.
	Count int64
	// Block is XREADGROUP's BLOCK. Default 5s, as the seed.
	Block time.Duration
	// Stripe sends the meter events.
	Stripe MeterSender
	// Identifier sends the event's event_id as Stripe's identifier and
	// takes a duplicate-identifier refusal as delivered (the variant with
	// an identifier and no ledger). False sends none.
	Identifier bool
	// DeferAck is failure mode 2: XACK a batch's ids only at its end, and
	// nothing when a call fails part-way.
	DeferAck bool
	// Logger; discarded when nil.
	Logger *slog.Logger
}

// MeterConsumer is the seed's consumer sending meter events.
type MeterConsumer struct {
	cfg MeterConsumerConfig
	log *slog.Logger

	groupOnce sync.Mutex
	groupOK   bool
}

// NewMeterConsumer validates cfg and returns a MeterConsumer.
func NewMeterConsumer(cfg MeterConsumerConfig) (*MeterConsumer, error) {
	if cfg.Redis == nil || cfg.Stripe == nil {
		return nil, errors.New("naive: Redis and Stripe are required")
	}
	if cfg.Stream == "" || cfg.Group == "" || cfg.Name == "" {
		return nil, errors.New("naive: Stream, Group and Name are required")
	}
	cfg.Count = cmp.Or(cfg.Count, 1)
	cfg.Block = cmp.Or(cfg.Block, 5*time.Second)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &MeterConsumer{cfg: cfg, log: log.With(slog.String("consumer", cfg.Name))}, nil
}

// RunOnce does one XREADGROUP ... COUNT n BLOCK b STREAMS stream > and sends
// the batch it returns. sent counts the calls Stripe answered with success.
func (c *MeterConsumer) RunOnce(ctx context.Context) (sent int, err error) {
	if err := c.ensureGroup(ctx); err != nil {
		return 0, err
	}
	res, err := c.cfg.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, ">"},
		Count: c.cfg.Count, Block: c.cfg.Block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("naive: XREADGROUP %s: %w", c.cfg.Stream, err)
	}
	for _, s := range res {
		n, err := c.handle(ctx, s.Messages)
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// ProcessClaimed sends messages handed over by the Monitor (consumer-B):
// the second count of failure modes 1 to 3.
func (c *MeterConsumer) ProcessClaimed(ctx context.Context, msgs []redis.XMessage) error {
	_, err := c.handle(ctx, msgs)
	return err
}

// handle is the seed's `for msg_id, fields in messages:` body with
// stripe.billing.MeterEvent.create.
func (c *MeterConsumer) handle(ctx context.Context, msgs []redis.XMessage) (int, error) {
	var sentIDs []string
	sent := 0
	for _, m := range msgs {
		var ev MeterEvent
		raw, _ := m.Values[PayloadField].(string)
		if err := json.Unmarshal([]byte(raw), &ev); err != nil {
			return sent, fmt.Errorf("naive: decoding payload of %s: %w", m.ID, err)
		}
		req := stripeapi.MeterEvent{EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID,
			Value: ev.Value, Timestamp: ev.Timestamp}
		if c.cfg.Identifier {
			// Deterministic: the same event gets the same identifier on
			// every delivery. Stripe remembers it for its window only.
			req.Identifier = ev.EventID
		}
		_, err := c.cfg.Stripe.SendMeterEvent(ctx, req)
		switch {
		case err == nil:
			sent++
		case c.cfg.Identifier && errors.Is(err, stripeapi.ErrDuplicateIdentifier):
			// "An event already exists with identifier …": sent before,
			// so the fix acks it. Right, while Stripe still remembers.
		default:
			return sent, fmt.Errorf("naive: sending meter event of %s (entry %s): %w", ev.StripeCustomerID, m.ID, err)
		}
		if c.cfg.DeferAck {
			sentIDs = append(sentIDs, m.ID)
			continue
		}
		if err := c.cfg.Redis.XAck(ctx, c.cfg.Stream, c.cfg.Group, m.ID).Err(); err != nil {
			return sent, fmt.Errorf("naive: XACK %s: %w", m.ID, err)
		}
	}
	if len(sentIDs) > 0 {
		if err := c.cfg.Redis.XAck(ctx, c.cfg.Stream, c.cfg.Group, sentIDs...).Err(); err != nil {
			return sent, fmt.Errorf("naive: XACK batch of %d: %w", len(sentIDs), err)
		}
	}
	return sent, nil
}

func (c *MeterConsumer) ensureGroup(ctx context.Context) error {
	c.groupOnce.Lock()
	defer c.groupOnce.Unlock()
	if c.groupOK {
		return nil
	}
	if err := CreateGroup(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group); err != nil {
		return err
	}
	c.groupOK = true
	return nil
}
