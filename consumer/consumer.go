// Package consumer reads billing events from a Redis Stream consumer group
// and charges each customer exactly once per billing period.
//
// Per event (DESIGN.md "Consumer, per event"): validate → ledger reserve
// (with the spend cap; a read batch at once) → Stripe with the content-hash
// idempotency key → fenced ledger finish → XACK (charges recorded and acked
// in groups, each entry only after its own outcome committed). A heartbeat
// renews both the PEL entry and the
// ledger lease from the moment XREADGROUP returns until the ack, closing
// "reclaim while in flight"; per-event write-before-ack closes "partial
// batch"; the ledger check before every charge closes "AOF rollback".
package consumer

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/startstop"
	"github.com/pelguard/pelguard/internal/tracing"
)

// Defaults.
const (
	DefaultCount         = 10
	DefaultBlock         = 2 * time.Second
	DefaultWorkers       = 4
	DefaultLease         = 30 * time.Second
	DefaultSafeKeyWindow = 23 * time.Hour
	// DefaultFollowUpEvery is how often FollowUp runs in a consumer.
	DefaultFollowUpEvery = 30 * time.Second
	DefaultNamespace     = "pelguard"
)

// Config configures a Consumer (and the Processor the reaper borrows).
type Config struct {
	Redis redis.UniversalClient // required
	// DB reaches the ledger (the tables `migrations.New(...).Up` creates).
	// Required. A Stripe call in flight holds no connection.
	DB *pgxpool.Pool
	// Schema is the Postgres schema that holds pelguard's tables (default
	// "pelguard", what `migrate up` creates). Every statement names it, so
	// a team's own tables elsewhere in the database are never touched.
	Schema string
	// Stripe is the charge adapter; required. Build it with stripeapi.New
	// and share one per process, so its rate limit is shared.
	Stripe Stripe

	Stream string // required
	Group  string // required
	// Name is the consumer name. Empty: a unique one per process (host, pid,
	// random suffix), never the bare hostname. A pinned name (a StatefulSet
	// pod name) makes the consumer drain its own PEL first after a restart.
	Name string
	// Namespace keeps environments from sharing idempotency keys.
	Namespace string

	Count int64         // XREADGROUP COUNT; acks stay per event whatever it is
	Block time.Duration // XREADGROUP BLOCK
	// Workers is how many events are handled at once. A charge waiting for
	// its group's commit and XACK (the settler) no longer holds a worker.
	Workers int
	// Lease is how long the ledger lease lasts without a heartbeat; the
	// heartbeat runs every Lease/3.
	Lease time.Duration
	// SafeKeyWindow: a takeover later than this after the first attempt looks
	// for an existing charge at Stripe before charging (Stripe keeps keys 24 h).
	SafeKeyWindow time.Duration
	RequireCap    bool
	Rules         event.Rules
	// Retry is the fleet's decline and bank-debit policy: the reaper's
	// re-drives and the webhook must be given the same one. Its zero value
	// means the defaults.
	Retry RetryPolicy
	// FollowUpEvery is how often the consumer polls processing charges
	// and drives due ledger retries (FollowUp). 0 means
	// DefaultFollowUpEvery; negative turns the loop off (another process,
	// or a test, calls FollowUp).
	FollowUpEvery time.Duration
	// Description is the Stripe charge description; default the seed's
	// "Usage billing for <period>".
	Description func(event.Event) string
	// OmitChargeMetadata sends charges without pelguard's metadata, in the
	// request shape of the article's consumer, so that Stripe accepts a
	// charge under a key the team's old consumer already used within 24 h
	// (it answers idempotency_error to the same key with other parameters)
	// and returns the team's charge. Use it with the Charges API
	// (stripeapi.ModeCharges) and the team's Namespace. pelguard still finds
	// such charges: by the charge id its ledger records, and by customer,
	// amount, currency and description in its look-ups.
	OmitChargeMetadata bool

	Notifier    alerts.Notifier              // default: log-only
	DeadLetters *alerts.DeadLetterAggregator // optional: dead-letter alerts per interval
	Metrics     *Metrics                     // optional
	Logger      *slog.Logger                 // default: discard
	Clock       clock.Clock                  // default: wall clock
	// TracerProvider makes the spans of each event (pelguard.event with
	// stripe.charge, stripe.find_charge and redis.xack children). nil: the
	// global provider, a no-op unless the binary installed the SDK.
	TracerProvider trace.TracerProvider

	// Witness is the process's ledger witness (pelguard's binaries give
	// their internal/rollback monitor): the ledger's outcome writes bump
	// it, every XACK and dead letter waits for its mirror, and while it
	// reports a rollback unrepaired every charge asks Stripe first. nil:
	// the ledger is trusted as it is.
	Witness LedgerWitness

	// Paused, when set, reports an operator's pause of the stream's
	// billing (pelguard's binaries: internal/streamfacts's Watcher). While
	// it says true the consumer reads nothing new, starts no event (one it
	// read is given back: pending, no lease) and skips its follow-ups;
	// a Stripe call already made finishes and is recorded.
	Paused func() bool

	// Test holds hooks for tests and the drill; production leaves it zero.
	Test TestConfig

	// pinned is set when Name was given: drain the PEL first.
	pinned bool
	// ledger is built from DB and Clock by setDefaults.
	ledger *ledger.Ledger
}

// TestConfig holds hooks that only tests and the drill set (River's
// TestConfig pattern): none of them belongs in a production Config.
type TestConfig struct {
	// AfterStripeReply, if set, runs after Stripe has answered a charge and
	// before the outcome is written: the window where a killed process leaves
	// a charge the ledger has not recorded. It runs after every answer,
	// errors (a decline, a 5xx) included: a hook that must act only on a
	// charge made wraps the Stripe client instead (the drill's child does).
	// The tests kill the process here.
	AfterStripeReply func()

	// DisableHeartbeat is for tests that prove the other defences hold
	// without it.
	DisableHeartbeat bool
}

func (c *Config) setDefaults() {
	c.pinned = c.Name != ""
	c.Name = cmp.Or(c.Name, UniqueName())
	c.Namespace = cmp.Or(c.Namespace, DefaultNamespace)
	c.Count = cmp.Or(c.Count, DefaultCount)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.SafeKeyWindow = cmp.Or(c.SafeKeyWindow, DefaultSafeKeyWindow)
	c.Retry = c.Retry.withDefaults()
	c.FollowUpEvery = cmp.Or(c.FollowUpEvery, DefaultFollowUpEvery)
	if c.Description == nil {
		c.Description = func(ev event.Event) string { return "Usage billing for " + ev.BillingPeriod }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Notifier == nil {
		c.Notifier = alerts.NewLog(c.Logger)
	}
	c.Clock = clock.Or(c.Clock)
	if c.ledger == nil && c.DB != nil {
		c.ledger = ledger.New(c.DB, c.Schema, c.Clock)
		if c.Witness != nil {
			c.ledger.SetWitness(c.Witness)
		}
	}
	if c.Witness == nil {
		c.Witness = noWitness{}
	}
}

// DescriptionTemplate makes a Description from a template in which
// {period} stands for the billing period ("Usage billing for {period}"):
// the team's description, so that look-ups recognise the team's charges
// and a charge under the team's key has the team's request shape.
func DescriptionTemplate(tmpl string) func(event.Event) string {
	return func(ev event.Event) string { return strings.ReplaceAll(tmpl, "{period}", ev.BillingPeriod) }
}

// Validate reports the first configuration error, naming the fix.
func (c *Config) Validate() error {
	switch {
	case c.Redis == nil:
		return errors.New("consumer: Redis client is required")
	case c.DB == nil:
		return errors.New("consumer: a Postgres pool (DB) is required")
	case c.Schema != "" && pg.ValidSchema(c.Schema) != nil:
		return fmt.Errorf("consumer: --db-schema: %w", pg.ValidSchema(c.Schema))
	case c.Stripe == nil:
		return errors.New("consumer: Stripe client is required")
	case c.Stream == "":
		return errors.New("consumer: --stream is required")
	case c.Group == "":
		return errors.New("consumer: --group is required")
	case c.Count < 1 || c.Count > 1000:
		return fmt.Errorf("consumer: --count %d must be between 1 and 1000", c.Count)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("consumer: --workers %d must be between 1 and 256", c.Workers)
	case c.Lease < 300*time.Millisecond:
		return fmt.Errorf("consumer: --lease %s is too short (minimum 300ms; it must outlive a heartbeat round trip)", c.Lease)
	case c.Block < 0:
		return fmt.Errorf("consumer: --block %s must not be negative", c.Block)
	case c.Retry.Validate() != nil:
		return fmt.Errorf("consumer: %w", c.Retry.Validate())
	case c.SafeKeyWindow <= 0 || c.SafeKeyWindow >= 24*time.Hour:
		return fmt.Errorf("consumer: --safe-key-window %s must be below Stripe's 24h idempotency window", c.SafeKeyWindow)
	}
	return nil
}

// UniqueName returns host-pid-random: unique per process, so two processes
// never share a PEL by accident.
func UniqueName() string {
	host, _ := os.Hostname()
	host = cmp.Or(strings.SplitN(host, ".", 2)[0], "host")
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// NewProcessor builds the per-event machinery alone, for the reaper's
// re-drive. Run its heartbeat with RunHeartbeat for as long as it is used.
func NewProcessor(cfg Config) (*Processor, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Metrics.startStream(cfg.Stream)
	return &Processor{cfg: cfg, tracer: tracing.Tracer(cfg.TracerProvider), hb: newHeartbeat(cfg.Redis, cfg.ledger, cfg.Stream, cfg.Group, cfg.Name, cfg.Lease, cfg.Logger, cfg.Metrics, cfg.Test.DisableHeartbeat)}, nil
}

// RunHeartbeat renews the processor's holds until ctx is done.
func (p *Processor) RunHeartbeat(ctx context.Context) { p.hb.run(ctx) }

// Name is the consumer name the processor acts as.
func (p *Processor) Name() string { return p.cfg.Name }

// Consumer is the billing consumer: a reader, a pool of workers, a heartbeat.
type Consumer struct {
	proc *Processor
	cfg  Config

	svc startstop.Service
}

// New validates cfg and builds a Consumer.
func New(cfg Config) (*Consumer, error) {
	p, err := NewProcessor(cfg)
	if err != nil {
		return nil, err
	}
	return &Consumer{proc: p, cfg: p.cfg}, nil
}

// Name is the consumer name in use.
func (c *Consumer) Name() string { return c.cfg.Name }

// Stream is the stream the consumer reads.
func (c *Consumer) Stream() string { return c.cfg.Stream }

// EnsureGroup creates the consumer group (and the stream) if missing. New
// groups start at "0": entries already on the stream are billed.
func EnsureGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("creating group %s on %s: %w", group, stream, err)
	}
	return nil
}

// Errors from Start (the shared start/stop contract).
var (
	ErrAlreadyStarted = startstop.ErrAlreadyStarted
	ErrStopped        = startstop.ErrStopped
)

// Start creates the group if needed and begins consuming in the background.
func (c *Consumer) Start(ctx context.Context) error {
	if err := EnsureGroup(ctx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group); err != nil {
		return err
	}
	return c.svc.Start(ctx, c.run)
}

// Stop stops reading, lets events in flight finish (their Stripe calls and
// ledger writes complete), and returns when they have. If ctx ends first,
// work in progress is cancelled (its entries stay pending, safe to redeliver)
// and ctx's error is returned. Stop is idempotent and safe before Start.
func (c *Consumer) Stop(ctx context.Context) error { return c.svc.Stop(ctx) }

// Done is closed when the consumer has stopped.
func (c *Consumer) Done() <-chan struct{} { return c.svc.Done() }

type job struct {
	stream string
	msg    redis.XMessage
	h      *hold
	pre    *prepared // the parsed event and the batch reservation's decision; nil: none
	readAt time.Time // when XREADGROUP returned it: the start of its span
}

func (c *Consumer) run(readCtx, workCtx context.Context) error {
	hbCtx, stopHB := context.WithCancel(workCtx)
	defer stopHB()
	go c.proc.hb.run(hbCtx)

	c.proc.settler = newSettler(c.proc, settleGroupMax)
	stopSettling := make(chan struct{})
	settled := make(chan struct{})
	go func() { defer close(settled); c.proc.settler.run(stopSettling) }()
	defer func() { close(stopSettling); <-settled }() // after the workers: everything handed over is settled
	c.proc.hb.checker = newOwnedChecker(c.proc.hb, settleGroupMax)
	stopChecks := make(chan struct{})
	checked := make(chan struct{})
	go func() { defer close(checked); c.proc.hb.checker.run(stopChecks) }()
	defer func() { close(stopChecks); <-checked }()

	// One read batch of look-ahead: while the workers charge one batch, the
	// reader reads and reserves the next, so they never wait for its
	// ledger round trips.
	jobs := make(chan job, c.cfg.Count)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if readCtx.Err() != nil || c.paused() {
					// Queued, not started, when the stop or a pause came: it
					// stays pending without a lease (for the reaper once
					// billing resumes), never sent.
					c.giveBack(workCtx, j)
					continue
				}
				c.handle(j)
			}
		}()
	}
	followUpDone := make(chan struct{})
	go func() { defer close(followUpDone); c.followUpLoop(readCtx, workCtx) }()
	err := c.readLoop(readCtx, workCtx, jobs)
	close(jobs)
	wg.Wait()
	<-followUpDone
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// followUpLoop runs FollowUp every FollowUpEvery until reading stops; a
// pass in progress finishes (its charges are recorded) with workCtx.
func (c *Consumer) followUpLoop(readCtx, workCtx context.Context) {
	if c.cfg.FollowUpEvery < 0 {
		return
	}
	t := time.NewTicker(c.cfg.FollowUpEvery)
	defer t.Stop()
	for {
		select {
		case <-readCtx.Done():
			return
		case <-t.C:
		}
		if c.paused() {
			continue // money in motion waits with the stream: nothing sent while paused
		}
		res, err := c.proc.FollowUp(workCtx)
		switch {
		case err != nil && workCtx.Err() == nil:
			c.cfg.Logger.WarnContext(workCtx, "ledger follow-up failed; the next pass retries", slog.Any("error", err))
		case res.Polled+res.Retried+res.CapBlocked > 0:
			c.cfg.Logger.InfoContext(workCtx, "ledger follow-up", slog.Int("polled", res.Polled), slog.Int("settled", res.Settled),
				slog.Int("retried", res.Retried), slog.Int("cap_blocked", res.CapBlocked))
		}
	}
}

// FollowUp runs one pass of the ledger's own work (Processor.FollowUp).
func (c *Consumer) FollowUp(ctx context.Context) (FollowUpResult, error) { return c.proc.FollowUp(ctx) }

// settleGroupMax bounds one settled group (and the charges queued for it).
const settleGroupMax = 256

// pausePoll is how often a paused consumer looks whether it was resumed.
const pausePoll = 250 * time.Millisecond

func (c *Consumer) paused() bool { return c.cfg.Paused != nil && c.cfg.Paused() }

func (c *Consumer) handle(j job) {
	// Outcomes are logged and counted inside; the hold is let go once the
	// event has ended, which for a charge is after its group is acked.
	_, _ = c.proc.processPrepared(j.h, j.msg, j.pre, j.readAt, func() {
		c.proc.hb.remove(j.h)
		c.cfg.Metrics.held(c.cfg.Stream, -1)
	})
}

// giveBack lets go of an entry the consumer is stopping before it started
// on it: it stays pending (never acked) for the next delivery, and the lease
// the batch reservation took for it is released so that delivery need not
// wait for it to expire.
func (c *Consumer) giveBack(ctx context.Context, j job) {
	if r := j.pre.lease(); r != nil {
		c.proc.releaseQuiet(ctx, *r, errors.New("consumer shut down before handling it"))
	}
	c.proc.hb.remove(j.h)
	c.cfg.Metrics.held(c.cfg.Stream, -1)
}

// readLoop reads batches and hands every entry to a worker. With a pinned
// name it first drains its own PEL ("0"), then reads new entries (">").
func (c *Consumer) readLoop(readCtx, workCtx context.Context, jobs chan<- job) error {
	draining := c.cfg.pinned
	cursor := ">"
	if draining {
		cursor = "0"
	}
	backoff := 100 * time.Millisecond
	for readCtx.Err() == nil {
		if c.paused() {
			select {
			case <-readCtx.Done():
				return readCtx.Err()
			case <-time.After(pausePoll):
			}
			continue
		}
		sent := time.Now()
		res, err := c.cfg.Redis.XReadGroup(readCtx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, cursor},
			Count: c.cfg.Count, Block: c.cfg.Block,
		}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case readCtx.Err() != nil:
			return readCtx.Err()
		case err != nil:
			if redis.HasErrorPrefix(err, "NOGROUP") {
				// The group vanished (Redis restarted empty, or a rollback
				// lost it): recreate it rather than spin.
				if gerr := EnsureGroup(readCtx, c.cfg.Redis, c.cfg.Stream, c.cfg.Group); gerr != nil {
					c.cfg.Logger.WarnContext(readCtx, "recreating group failed", slog.Any("error", gerr))
				}
			}
			c.cfg.Logger.WarnContext(readCtx, "XREADGROUP failed; retrying", slog.Any("error", err), slog.Duration("backoff", backoff))
			select {
			case <-readCtx.Done():
				return readCtx.Err()
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		readAt := time.Now()
		var msgs []redis.XMessage
		for _, s := range res {
			msgs = append(msgs, s.Messages...)
		}
		if draining {
			if len(msgs) == 0 {
				draining, cursor = false, ">" // own PEL drained: read new entries
				continue
			}
			cursor = msgs[len(msgs)-1].ID // continue after the last own entry
		}
		// Every entry of the batch is in our PEL from this moment: hold them
		// all (the heartbeat covers entries still waiting for a worker).
		holds := make([]*hold, len(msgs))
		for i, m := range msgs {
			holds[i] = c.proc.hb.add(workCtx, c.cfg.Stream, m.ID)
			if cursor == ">" {
				// Delivered by this read: idle since it was sent at most.
				holds[i].setProven(sent)
			}
			c.cfg.Metrics.held(c.cfg.Stream, 1)
		}
		pre := c.reserveBatch(workCtx, msgs, holds)
		for i, m := range msgs {
			select {
			case jobs <- job{stream: c.cfg.Stream, msg: m, h: holds[i], pre: pre[i], readAt: readAt}:
			case <-readCtx.Done():
				for k := i; k < len(msgs); k++ {
					c.giveBack(workCtx, job{stream: c.cfg.Stream, msg: msgs[k], h: holds[k], pre: pre[k]})
				}
				return readCtx.Err()
			}
		}
	}
	return readCtx.Err()
}

// prepared is what the reader learnt of an entry before a worker took it:
// the parsed event and the batch reservation's answer for it.
type prepared struct {
	ev    event.Event
	batch ledger.BatchClaim // undecided: the worker reserves it with Reserve
}

// lease is the ledger lease the batch took for the entry, if it took one.
func (p *prepared) lease() *ledger.Record {
	if p == nil || !p.batch.Decided || p.batch.Err != nil || !p.batch.Claim.Decision.MayCharge() {
		return nil
	}
	return &p.batch.Claim.Record
}

// reserveBatch decides every valid entry of a read batch in the ledger at
// once (ledger.ReserveBatch): new rows, takeovers, terminal rows, busy rows,
// conflicts and spend caps in one statement for a batch of first
// deliveries, one more transaction for the rest, instead of one
// transaction per event. The workers act on each decision as on Reserve's;
// what the batch left undecided (a batch of one, and invalid entries, nil)
// they reserve one by one.
func (c *Consumer) reserveBatch(ctx context.Context, msgs []redis.XMessage, holds []*hold) []*prepared {
	pre := make([]*prepared, len(msgs))
	reqs := make([]ledger.ReserveRequest, 0, len(msgs))
	at := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if m.Values == nil {
			continue
		}
		ev, err := event.ParseFields(m.Values, c.cfg.Rules)
		if err != nil {
			continue // the worker dead-letters it with the reason
		}
		pre[i] = &prepared{ev: ev}
		req := c.proc.reserveRequest(ev, m.ID)
		req.Replay = IsReplay(m.Values)
		reqs = append(reqs, req)
		at = append(at, i)
	}
	if len(reqs) < 2 {
		// A batch of one gains nothing: its worker reserves it, so its row
		// turns pending only once a worker holds it (what Stop finishes).
		return pre
	}
	claims, err := c.cfg.ledger.ReserveBatch(ctx, reqs)
	if err != nil {
		c.cfg.Logger.WarnContext(ctx, "batch reservation failed in part; reserving the rest per event", slog.Any("error", err))
	}
	for j, cl := range claims {
		i := at[j]
		pre[i].batch = cl
		if r := pre[i].lease(); r != nil {
			holds[i].setLease(r) // the heartbeat renews it from now on
		}
	}
	return pre
}

// LedgerWitness keeps a witness of the ledger's progress outside Postgres,
// so that a ledger that went back in time (a failover to an asynchronous
// replica, a restore) is noticed and repaired (DESIGN.md "The ledger's own
// losses"). pelguard's binaries use internal/rollback's Monitor.
type LedgerWitness interface {
	// Writer names this process's row in ledger_witness.
	Writer() string
	// Committed is told the row's value once its transaction committed.
	Committed(seq int64)
	// Mirror makes the last committed value durable outside Postgres; it
	// is called before every XACK and dead letter.
	Mirror(ctx context.Context) error
	// Suspect reports a rollback not yet repaired: charge only after
	// asking Stripe.
	Suspect() bool
	// LostSince is where the unrepaired losses begin (zero: none).
	LostSince() time.Time
}

// noWitness is Config.Witness when none is given: the ledger is trusted.
type noWitness struct{}

func (noWitness) Writer() string               { return "" }
func (noWitness) Committed(int64)              {}
func (noWitness) Mirror(context.Context) error { return nil }
func (noWitness) Suspect() bool                { return false }
func (noWitness) LostSince() time.Time         { return time.Time{} }
