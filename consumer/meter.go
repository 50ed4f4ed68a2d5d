package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/stripeapi"
)

// Usage to Stripe Billing Meters (DESIGN.md "Usage to Stripe Billing
// Meters"): each stream entry is one meter event, sent to Stripe under an
// identifier derived from its business fields, reserved in the meter
// ledger before the call and recorded there before the XACK, one call at a
// time per customer and meter across the fleet. Stripe counts each event
// once: a redelivery of a delivered event is acked without a call, an
// unknown outcome is re-sent under the same identifier only while Stripe
// still guards it, and parked past that.

// MeterSender is the part of the Stripe adapter the meter consumer needs;
// *stripeapi.Client has it.
type MeterSender interface {
	SendMeterEvent(ctx context.Context, ev stripeapi.MeterEvent) (stripeapi.MeterEventResult, error)
}

// MeterConfig configures a MeterConsumer.
type MeterConfig struct {
	Redis  redis.UniversalClient // required
	DB     *pgxpool.Pool         // required
	Schema string                // default "pelguard"
	Stripe MeterSender           // required
	Stream string                // required
	Group  string                // required
	// Name is the consumer name; empty: UniqueName().
	Name      string
	Namespace string        // in every identifier; default DefaultNamespace
	Count     int64         // entries per read (and per ledger batch); default 100
	Block     time.Duration // XREADGROUP BLOCK; default DefaultBlock
	Workers   int           // Stripe calls at once, per batch; default 16
	// Pipeline is how many batches Run keeps in flight; default 2.
	Pipeline int
	// SendSlots is, with SendFromLedger, how many customer-meters are sent
	// to at once, in rounds of up to Workers; default 4×Workers.
	SendSlots int
	Lease     time.Duration // lease and customer-meter slot; default DefaultLease
	Rules     event.MeterRules
	// SafeWindow: an unknown outcome is re-sent only this long after the
	// first attempt (meterledger.DefaultSafeWindow, below Stripe's 24 h).
	SafeWindow time.Duration
	// SendFromLedger: record each event in the ledger at ingest and ack
	// it, and send from the ledger (meter_ingest.go); the ledger is fenced
	// against per-event consumers from the first start. Default: per
	// event, from the stream's pending entries.
	SendFromLedger bool
	// AggregateMeters are the event names of sum meters: with
	// SendFromLedger, one call carries the sum of a customer's queued
	// events of one timestamp second whose entries arrived in one second,
	// formed once the group's ingest watermark has passed that second, so
	// its members (and identifier) are fixed by the stream, the same after
	// a rollback of Redis and Postgres together (DESIGN.md "Usage at
	// volume"). Never a count or last meter: Stripe would count one event,
	// or keep one value (the command line checks the account's meters).
	AggregateMeters []string
	// AggregateBucket is the width of an aggregate's bucket of event time;
	// default meterledger.DefaultBucket (a second). Wider (whole seconds
	// dividing an hour: meterledger.CheckBucket), a bucket's events go as
	// one call at the bucket's start: fewer calls to catch up a backlog,
	// but usage after a subscription period boundary inside the bucket is
	// invoiced in the earlier period.
	AggregateBucket time.Duration
	Witness         LedgerWitness // see Config.Witness
	// Paused: see Config.Paused. A paused meter consumer reads nothing and
	// sends nothing; a batch read before the pause stays pending (its own
	// PEL, read again on resume), and so do the events of a batch reserved
	// before the pause whose calls had not started (meterledger.Unsent:
	// lease and slot freed, no attempt recorded as of unknown outcome).
	Paused func() bool
	// Metrics counts outcomes (pelguard_consumer_events_total with the
	// meter outcomes), Stripe calls, in-flight events and dead letters;
	// optional.
	Metrics  *Metrics
	Notifier alerts.Notifier
	// DeadLetters, optional, turns dead letters into one alert per stream
	// and interval: the same path as the billing consumer's.
	DeadLetters *alerts.DeadLetterAggregator
	Logger      *slog.Logger
	Clock       clock.Clock
}

func (c *MeterConfig) setDefaults() {
	c.Name = cmp.Or(c.Name, UniqueName())
	c.Namespace = cmp.Or(c.Namespace, DefaultNamespace)
	c.Count = cmp.Or(c.Count, 100)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.Workers = cmp.Or(c.Workers, 16)
	c.Pipeline = cmp.Or(c.Pipeline, 2)
	c.SendSlots = cmp.Or(c.SendSlots, 4*c.Workers)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.AggregateBucket = cmp.Or(c.AggregateBucket, meterledger.DefaultBucket)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Notifier == nil {
		c.Notifier = alerts.NewLog(c.Logger)
	}
	if c.Witness == nil {
		c.Witness = noWitness{}
	}
	c.Clock = clock.Or(c.Clock)
}

// MeterConsumer sends a stream's meter events to Stripe, each counted once.
type MeterConsumer struct {
	cfg    MeterConfig
	ledger *meterledger.Ledger
	// witnessed: a LedgerWitness is configured, so every ack is also
	// written to the meter witness (the usage repair's source).
	witnessed bool
	ledgerID  atomic.Pointer[string]
	// fenced: the ledger sends from ingest (meter_send_fence), so this
	// consumer's re-drives (the reaper's) ingest too; checkedFence is when
	// it was last read while unfenced.
	fenced       atomic.Bool
	checkedFence atomic.Int64
	// ingestedFrom is the oldest event timestamp (unix ns) ingested since
	// the sender last read the ledger's floor (meter_sender.go); MaxInt64:
	// none.
	ingestedFrom atomic.Int64
	// listFloor is the floor (unix ns) the sender last read: the
	// partitions from its day on are kept analyzed (freshenStats).
	listFloor atomic.Int64
	// missingMeters are the event names sayMeterMissing has told of.
	missingMeters sync.Map
	// live counts the entries handled, published with each liveness beat.
	live statCounter
}

// NewMeterConsumer checks cfg and returns a consumer; Run drives it.
func NewMeterConsumer(cfg MeterConfig) (*MeterConsumer, error) {
	cfg.setDefaults()
	if cfg.Redis == nil || cfg.DB == nil || cfg.Stripe == nil || cfg.Stream == "" || cfg.Group == "" {
		return nil, errors.New("consumer: a meter consumer needs Redis, DB, Stripe, Stream and Group")
	}
	if err := meterledger.CheckBucket(cfg.AggregateBucket); err != nil {
		return nil, fmt.Errorf("consumer: AggregateBucket: %w", err)
	}
	l, err := meterledger.New(cfg.DB, meterledger.Config{Schema: cfg.Schema, Clock: cfg.Clock, SafeWindow: cfg.SafeWindow})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if _, ok := cfg.Witness.(noWitness); !ok {
		l.SetWitness(cfg.Witness)
	}
	cfg.Metrics.startMeterStream(cfg.Stream)
	_, trusted := cfg.Witness.(noWitness)
	return &MeterConsumer{cfg: cfg, ledger: l, witnessed: !trusted}, nil
}

// Name is the consumer's name in the group.
func (c *MeterConsumer) Name() string { return c.cfg.Name }

// MeterBatch counts what one ProcessBatch did.
type MeterBatch struct {
	Delivered   int // sent and recorded (or found delivered by an earlier attempt)
	Already     int // delivered before: acked without a call
	DeadLetters int // invalid, refused by Stripe, outside Stripe's window, conflicting
	Parked      int // unknown outcome past the window: not re-sent, alerted
	OverCap     int // would pass the meter's spend cap: dead-lettered (spend_cap), alerted
	Left        int // left pending: busy, its customer's meter slot taken, held, or a transient outcome
	// Outcomes is each entry's outcome, by stream id.
	Outcomes map[string]Outcome
}

// count records entry id's outcome in b and in the metrics.
func (c *MeterConsumer) count(b *MeterBatch, id string, o Outcome) {
	if b.Outcomes == nil {
		b.Outcomes = map[string]Outcome{}
	}
	b.Outcomes[id] = o
	c.cfg.Metrics.event(c.cfg.Stream, o)
}

// Run reads and processes until ctx ends: its own pending entries first
// (a restart, entries left by an earlier batch), then new ones. Up to
// Pipeline batches are in flight at once, so the next batch's ledger work
// and calls overlap the slowest calls of the one before; entries of a batch
// in flight are never handed to another.
//
// A ctx that ends while Run starts is a stop, not a failure: Run returns
// nil then, as it does once running.
func (c *MeterConsumer) Run(ctx context.Context) error {
	if err := c.untilAnswered(ctx, "creating meter event partitions", func() error {
		_, err := c.ledger.EnsurePartitions(ctx, c.cfg.Clock.Now())
		return err
	}); err != nil || ctx.Err() != nil {
		return err
	}
	defer c.beatWhileRunning(ctx)()
	defer c.watchBacklogWhileRunning(ctx)()
	var waitSenders func()
	err := c.untilAnswered(ctx, "starting the meter event senders", func() (err error) {
		waitSenders, err = c.startSenders(ctx)
		return err
	})
	if waitSenders != nil {
		defer waitSenders()
	}
	if err != nil || ctx.Err() != nil {
		return err
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inFlight = map[string]bool{}                   // ids of entries in a batch in flight
		slots    = make(chan struct{}, c.cfg.Pipeline) // batches in flight
	)
	defer wg.Wait()
	// Our PEL first, then ">"; maintain (prune) on the first pass.
	own := "0"
	lastOwn, maintained := time.Now(), time.Time{}
	for ctx.Err() == nil {
		if c.cfg.Paused != nil && c.cfg.Paused() {
			sleep(ctx, pausePoll)
			own = "0" // on resume, what was left pending first
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		res, err := c.cfg.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: c.cfg.Group, Consumer: c.cfg.Name,
			Streams: []string{c.cfg.Stream, own}, Count: c.cfg.Count, Block: c.cfg.Block}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			<-slots
			if ctx.Err() != nil {
				return nil
			}
			c.cfg.Logger.Warn("reading meter events", "stream", c.cfg.Stream, "err", err)
			sleep(ctx, time.Second)
			continue
		}
		var msgs []redis.XMessage
		mu.Lock()
		for _, s := range res {
			for _, m := range s.Messages {
				if !inFlight[m.ID] { // our PEL read again: skip what a batch holds
					inFlight[m.ID] = true
					msgs = append(msgs, m)
				}
			}
		}
		mu.Unlock()
		drained := own == ">" && len(msgs) == 0
		if own == "0" {
			// Our PEL is read once per turn; what a batch leaves comes back
			// on the next turn.
			own, lastOwn = ">", time.Now()
		}
		if len(msgs) == 0 {
			<-slots
		} else {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				if c.cfg.Paused != nil && c.cfg.Paused() {
					// Read just before the pause: left pending, ours, read
					// again on resume.
				} else if _, err := c.ProcessBatch(ctx, msgs); err != nil && ctx.Err() == nil {
					c.cfg.Logger.Warn("processing meter events", "stream", c.cfg.Stream, "err", err)
					sleep(ctx, time.Second)
				}
				mu.Lock()
				for _, m := range msgs {
					delete(inFlight, m.ID)
				}
				mu.Unlock()
			}()
		}
		// Entries left pending (a slot taken, a transient error) are
		// ours: go back to them every half second while new ones come,
		// every ownRevisitIdle once the stream has none (a customer's
		// last events then follow each other at the pace of its calls).
		if since := time.Since(lastOwn); since > 500*time.Millisecond || drained && since > ownRevisitIdle {
			own = "0"
		}
		if time.Since(maintained) > time.Hour {
			maintained = time.Now()
			c.maintain(ctx)
		}
	}
	return nil
}

// ownRevisitIdle is how soon Run reads its own pending entries again
// once the stream has nothing new.
const ownRevisitIdle = 50 * time.Millisecond

// maintain makes the coming days' partitions and drops those Stripe would
// no longer take events for (older than 36 days): hourly, from every
// consumer (both are idempotent and serialised in Postgres).
func (c *MeterConsumer) maintain(ctx context.Context) {
	now := c.cfg.Clock.Now()
	if _, err := c.ledger.EnsurePartitions(ctx, now); err != nil && ctx.Err() == nil {
		c.cfg.Logger.Warn("creating meter event partitions", "err", err)
	}
	dropped, err := c.ledger.Prune(ctx, now)
	switch {
	case err != nil && ctx.Err() == nil:
		c.cfg.Logger.Warn("pruning meter event partitions", "err", err)
	case len(dropped) > 0:
		c.cfg.Logger.Info("pruned meter event partitions past Stripe's 35 days", "partitions", dropped)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// sentOf is the meter witness of r's event, recorded as rec with status.
func sentOf(r meterledger.Request, rec meterledger.Record, status meterledger.Status, reason string) meterwitness.Sent {
	ev := r.Event
	return meterwitness.Sent{Status: string(status), EventTS: ev.Timestamp, Identifier: r.Identifier, EventName: ev.EventName,
		StripeCustomerID: ev.StripeCustomerID, CustomerID: ev.CustomerID, Value: ev.Value, FirstSentAt: rec.FirstSentAt,
		MessageID: r.MessageID, Reason: reason}
}

// recordSent writes sent to the meter witness (internal/meterwitness):
// after the ledger writes, before the XACK. Members past their retention
// are pruned, never while a rollback is unrepaired (the repair reads them).
func (c *MeterConsumer) recordSent(ctx context.Context, sent []meterwitness.Sent) error {
	if !c.witnessed || len(sent) == 0 {
		return nil
	}
	id := c.ledgerID.Load()
	if id == nil {
		v, err := c.ledger.LedgerID(ctx)
		if err != nil {
			return fmt.Errorf("writing the meter witness: %w", err)
		}
		id = &v
		c.ledgerID.Store(id)
	}
	return meterwitness.Record(ctx, c.cfg.Redis, *id, meterwitness.Stream{Stream: c.cfg.Stream, Group: c.cfg.Group,
		Namespace: c.cfg.Namespace}, sent, c.cfg.Clock.Now(), !c.cfg.Witness.Suspect())
}

// Dead-letter reasons of the meter consumer.
const (
	// ReasonMeterRefused: Stripe refused the event for good (an unknown
	// meter, a value or timestamp it does not take).
	ReasonMeterRefused = "meter_event_refused"
	// ReasonMeterParked: its outcome is unknown and Stripe may no longer
	// guard its identifier (or it was refused after an attempt of unknown
	// outcome): not re-sent; a person checks at Stripe and settles it.
	ReasonMeterParked = "meter_event_parked"
	// ReasonMeterReplayRefused: a replay of an event Stripe may count, past
	// the safe window of its first attempt: not sent (it could count
	// twice). Settle it, or replay with an override.
	ReasonMeterReplayRefused = "meter_replay_refused"
)

// rateLimited reports Stripe's 429 (the account's rate, or a call of the
// customer's meter in flight): routine under load, not worth a warning.
func rateLimited(err error) bool {
	var se *stripeapi.Error
	return errors.As(err, &se) && se.HTTPStatus == http.StatusTooManyRequests
}

// meterOutcome is the outcome table of a meter event's call.
func meterOutcome(h meterledger.Hold, err error) meterledger.Outcome {
	out := meterledger.Outcome{Hold: h}
	switch {
	case err == nil, errors.Is(err, stripeapi.ErrDuplicateIdentifier):
		// A duplicate refusal: an earlier attempt got through and Stripe
		// counts it. Delivered.
		out.Result = meterledger.Delivered
	case errors.Is(err, stripeapi.ErrIdempotencyMismatch):
		out.Result, out.Reason = meterledger.Park, "Stripe has this identifier with other parameters: "+err.Error()
	case errors.Is(err, stripeapi.ErrInvalidRequest),
		// The key itself refused (401, or 403 for a missing permission):
		// Stripe counted nothing. Failed (not released: the safe window
		// would run out while the key is fixed), so a replay reopens it.
		errors.Is(err, stripeapi.ErrAuthentication), errors.Is(err, stripeapi.ErrPermission):
		out.Result, out.Reason = meterledger.Failed, err.Error()
	default: // transient, a timeout, a cancelled call: unknown outcome
		out.Result = meterledger.Release
		if err != nil {
			out.Reason = err.Error()
		}
	}
	return out
}

// sayMeterMissing tells, once per event name and process, that Stripe has
// no meter for it: one error log line and one meter_missing alert saying
// how to create the meter and replay, instead of a dead letter per event
// and nothing else. Later refusals are dead letters (and their alert). It
// reports whether it told (the event that told is left out of the
// dead_letters alert).
func (c *MeterConsumer) sayMeterMissing(eventName string) bool {
	if _, told := c.missingMeters.LoadOrStore(eventName, true); told {
		return false
	}
	c.cfg.Logger.Error("no Stripe meter for this event name: its events are dead-lettered (meter_event_refused) until the meter exists",
		"event_name", eventName, "stream", c.cfg.Stream,
		"create", "Stripe Dashboard → Billing → Meters, or POST /v1/billing/meters (event_name="+eventName+", default_aggregation[formula]=sum), which stripesim answers too",
		"replay", cmdname.Consumer+" replay --stream "+c.cfg.Stream+" --reason "+ReasonMeterRefused)
	c.cfg.Notifier.Notify(alerts.MeterMissing(eventName, c.cfg.Stream))
	return true
}

func (c *MeterConsumer) alertParked(r meterledger.Request, reason string) {
	c.cfg.Notifier.Notify(alerts.MeterEventParked(r.Event.EventName, r.Event.StripeCustomerID, r.Identifier, r.Event.Value, reason))
}

// requestOf reads entry m as a meter event request; an invalid event comes
// back as its dead letter, an error only when the entry cannot be judged.
func (c *MeterConsumer) requestOf(m redis.XMessage, now time.Time) (meterledger.Request, *Dead, error) {
	ev, err := event.ParseMeterFields(m.Values, c.cfg.Rules, now)
	if err != nil {
		var re *event.RejectError
		if !errors.As(err, &re) {
			return meterledger.Request{}, nil, err
		}
		return meterledger.Request{}, &Dead{Msg: m, Reason: re.Reason, Detail: re.Error()}, nil
	}
	r := meterledger.Request{Event: ev, Identifier: ev.Identifier(c.cfg.Namespace), Owner: c.cfg.Name,
		Lease: c.cfg.Lease, MessageID: m.ID, Suspect: c.cfg.Witness.Suspect(), Replay: IsReplay(m.Values)}
	if r.Replay {
		r.Override, _ = m.Values[ReplayOverrideField].(string)
	}
	return r, nil, nil
}
