// Package naive is the seed article's billing consumer and stuck-message
// monitor, ported to Go line for line, bugs included. It exists only as the
// baseline that the drill (cmd/chaos) and the consumer benchmark compare
// pelguard against; nothing in production may use it.
//
// The bugs it keeps on purpose, so the drill can reproduce every failure mode:
//   - no idempotency key and no metadata on the charge, currency "usd"
//     hard-coded, description "Usage billing for <period>";
//   - ack after the charge, with no pre-flight check of any ledger;
//   - reclaim while in flight (failure mode 1): the Monitor's XAUTOCLAIM takes
//     entries whose consumer is merely slow, and ProcessClaimed charges them
//     again;
//   - partial batch (failure mode 2): with DeferAck, a batch's ids are acked
//     only at the end, and a Stripe error abandons the whole batch unacked;
//   - AOF rollback (failure mode 3): Record writes billing_records and then
//     XACKs, but nothing ever reads billing_records before charging.
//
// MeterConsumer (meter.go) is the same loop sending usage to Stripe Billing
// Meters (stripe.billing.MeterEvent.create), without an identifier or with
// a deterministic one and no ledger; the Monitor reclaims for it as well.
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

// PayloadField is the stream field holding the event's JSON.
const PayloadField = "payload"

// Event is the seed's billing event. It is decoded with json.Unmarshal and
// not validated, exactly as the seed does (`json.loads(fields[b"payload"])`).
type Event struct {
	CustomerID       string `json:"customer_id"`
	StripeCustomerID string `json:"stripe_customer_id"`
	AmountCents      int64  `json:"amount_cents"`
	BillingPeriod    string `json:"billing_period"`
	Currency         string `json:"currency"`
}

// ConsumerConfig configures a naive Consumer.
type ConsumerConfig struct {
	Redis  redis.UniversalClient
	Stream string
	Group  string
	// Name is the consumer name; the seed hard-codes "worker-1".
	Name string
	// Count is XREADGROUP's COUNT: 1 as in failure modes 1 and 3, 10 for the
	// batch variant of failure mode 2. Default 1.
	Count int64
	// Block is XREADGROUP's BLOCK. Default 5s, as the seed.
	Block time.Duration
	// Stripe makes the charges. The naive code never sets an idempotency key.
	Stripe *stripeapi.Client
	// DeferAck is failure mode 2: collect the batch's ids and XACK them all
	// at the end; on a Stripe error, break out of the batch and ack nothing.
	DeferAck bool
	// Record, if set, runs after the charge and before XACK: failure mode 3's
	// INSERT INTO billing_records. The naive consumer never reads it back
	// before charging, which is the bug.
	Record func(ctx context.Context, msgID string, ev Event, charge stripeapi.Charge) error
	// Logger; discarded when nil.
	Logger *slog.Logger
}

// Consumer is the seed's billing consumer.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger

	groupOnce sync.Mutex
	groupOK   bool
}

// NewConsumer validates cfg and returns a Consumer.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
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
	return &Consumer{cfg: cfg, log: log.With(slog.String("consumer", cfg.Name))}, nil
}

// RunOnce does one XREADGROUP ... COUNT n BLOCK b STREAMS stream > and
// handles the batch it returns. processed counts the events charged.
func (c *Consumer) RunOnce(ctx context.Context) (processed int, err error) {
	if err := c.ensureGroup(ctx); err != nil {
		return 0, err
	}
	res, err := c.cfg.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    c.cfg.Group,
		Consumer: c.cfg.Name,
		Streams:  []string{c.cfg.Stream, ">"},
		Count:    c.cfg.Count,
		Block:    c.cfg.Block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("naive: XREADGROUP %s: %w", c.cfg.Stream, err)
	}
	for _, s := range res {
		n, err := c.handle(ctx, s.Messages)
		processed += n
		if err != nil {
			return processed, err
		}
	}
	return processed, nil
}

// ProcessClaimed charges messages handed over by the Monitor, the seed's
// "XAUTOCLAIM ... delivers the entire batch to consumer-B; consumer-B calls
// stripe.charges.create()". It is the double charge of failure modes 1 and 2.
func (c *Consumer) ProcessClaimed(ctx context.Context, msgs []redis.XMessage) error {
	_, err := c.handle(ctx, msgs)
	return err
}

// Run loops RunOnce until ctx ends. The seed's `while True` dies on the first
// exception; this loop logs and keeps going so that a drill run finishes,
// which leaves the failed entry pending exactly as a crash would.
func (c *Consumer) Run(ctx context.Context) error {
	for {
		if ctx.Err() != nil {
			return nil
		}
		if _, err := c.RunOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.log.WarnContext(ctx, "naive consumer: batch failed, entries stay pending", slog.Any("error", err))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// handle is the seed's `for msg_id, fields in messages:` body.
func (c *Consumer) handle(ctx context.Context, msgs []redis.XMessage) (int, error) {
	var chargedIDs []string
	processed := 0
	for _, m := range msgs {
		var ev Event
		raw, _ := m.Values[PayloadField].(string)
		if err := json.Unmarshal([]byte(raw), &ev); err != nil {
			// The seed's json.loads raises and the loop dies: the entry
			// (and, with DeferAck, the whole batch) stays pending.
			return processed, fmt.Errorf("naive: decoding payload of %s: %w", m.ID, err)
		}

		ch, err := c.cfg.Stripe.Charge(ctx, stripeapi.ChargeRequest{
			// no idempotency_key: a reclaimed or redelivered entry creates
			// a second charge.
			StripeCustomerID: ev.StripeCustomerID,
			AmountCents:      ev.AmountCents,
			Currency:         "usd",
			Description:      "Usage billing for " + ev.BillingPeriod,
		})
		if err != nil {
			// DeferAck: "Processing aborts here. charged_ids holds msg IDs
			// for customers 1-6 who were successfully billed." Nothing acked.
			return processed, fmt.Errorf("naive: charging %s for %s (entry %s): %w", ev.CustomerID, ev.BillingPeriod, m.ID, err)
		}
		processed++

		if c.cfg.Record != nil {
			if err := c.cfg.Record(ctx, m.ID, ev, ch); err != nil {
				return processed, fmt.Errorf("naive: recording %s for %s: %w", ev.CustomerID, ev.BillingPeriod, err)
			}
		}

		if c.cfg.DeferAck {
			// Does NOT call XACK here — defers to the end of the loop.
			chargedIDs = append(chargedIDs, m.ID)
			continue
		}
		if err := c.cfg.Redis.XAck(ctx, c.cfg.Stream, c.cfg.Group, m.ID).Err(); err != nil {
			return processed, fmt.Errorf("naive: XACK %s: %w", m.ID, err)
		}
		c.log.InfoContext(ctx, "Charged", slog.String("customer_id", ev.CustomerID), slog.String("charge_id", ch.ID))
	}
	if len(chargedIDs) > 0 {
		if err := c.cfg.Redis.XAck(ctx, c.cfg.Stream, c.cfg.Group, chargedIDs...).Err(); err != nil {
			return processed, fmt.Errorf("naive: XACK batch of %d: %w", len(chargedIDs), err)
		}
	}
	return processed, nil
}

// ensureGroup creates the group at the stream's start with MKSTREAM, once.
func (c *Consumer) ensureGroup(ctx context.Context) error {
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

// CreateGroup runs XGROUP CREATE stream group 0 MKSTREAM and treats an
// existing group as success.
func CreateGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !isBusyGroup(err) {
		return fmt.Errorf("naive: XGROUP CREATE %s %s: %w", stream, group, err)
	}
	return nil
}

// isBusyGroup matches Redis's BUSYGROUP error code, the prefix Redis puts
// first in the error reply.
func isBusyGroup(err error) bool {
	return redis.HasErrorPrefix(err, "BUSYGROUP")
}
