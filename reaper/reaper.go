// Package reaper recovers what dead consumers leave in a billing stream's
// pending entries list, without ever claiming an entry a live consumer is
// still working on.
//
// It replaces the naive "stuck message" monitor that XAUTOCLAIMs anything
// idle longer than N ms: that monitor is how "reclaim while in flight" turns
// a slow Stripe call into a second charge. Per pass (DESIGN.md "Reaper, per
// pass"), for every configured stream:
//
//  1. XPENDING … IDLE <min-idle>, paged;
//  2. bodies by pipelined XRANGE id id, ledger rows for the page in one query;
//  3. a decision per entry: body gone → ack; invalid → dead letter + ack;
//     ledger terminal → ack without redelivery ("partial batch", "AOF
//     rollback"); live ledger lease → skip; too many deliveries → dead letter
//     + ack + alert; otherwise XCLAIM with the same min-idle (the fence
//     against heartbeats and other reapers) and re-drive through the
//     consumer's own Processor.
//
// The reaper never uses XAUTOCLAIM: a claim must be preceded by the ledger
// check, entry by entry.
package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/startstop"
	"github.com/pelguard/pelguard/internal/tracing"
)

// Defaults.
const (
	// DefaultMinIdle matches the seeds' monitor. It must exceed the
	// consumers' heartbeat interval (their lease/3) by a wide margin, so a
	// live consumer's entry never even looks idle.
	DefaultMinIdle       = 60 * time.Second
	DefaultInterval      = 15 * time.Second
	DefaultPageSize      = 1000
	DefaultMaxDeliveries = 10
	DefaultWorkers       = 8
	DefaultPageWorkers   = 4
	// DefaultConsumerIdle: consumers silent for a day with nothing pending
	// are removed from the group. Zero in Config means this default; a
	// negative value disables hygiene.
	DefaultConsumerIdle = 24 * time.Hour
	// DefaultStreamRetention: entries are kept a week even once every group
	// has read and acked them, for replay, for a ledger rollback's re-ingest
	// (the repair reads Stripe back at most rollback's seven-day fallback),
	// for groups created at 0 or moved back, and for readers without a group.
	DefaultStreamRetention = 7 * 24 * time.Hour
	// DefaultTrimLimit is XTRIM's LIMIT per stream and pass (Redis's own
	// default for "~"): one call removes at most this many entries, so it
	// never blocks Redis for long; a backlog goes over several passes.
	DefaultTrimLimit = 10_000
	// DefaultDeadLetterMax and DefaultDeadLetterMaxAge: a dead-letter stream
	// with this many entries, or whose oldest entry is this old, is alerted
	// on (KindDeadLettersWaiting).
	DefaultDeadLetterMax    = 1000
	DefaultDeadLetterMaxAge = 72 * time.Hour
	// retentionReach is how far before an event's first attempt the
	// ledger's repair after a rollback may need its entry: rollback's
	// DefaultMargin before the last surviving stamp, and the hour a
	// look-up lists before a first attempt (consumer's lookupSince).
	retentionReach = rollback.DefaultMargin + time.Hour
)

// MinStreamRetention is the shortest StreamRetention Validate accepts for
// cfg: the longest safe window (--safe-key-window, and --meter-safe-window
// with meter streams) plus the repair's reach. A shorter retention could
// trim an entry whose outcome a re-ingest after a ledger rollback must
// still settle by its key.
func MinStreamRetention(cfg Config) time.Duration {
	if soakRetentionFloor > 0 {
		return soakRetentionFloor
	}
	w := cmp.Or(cfg.SafeKeyWindow, consumer.DefaultSafeKeyWindow)
	if len(cfg.MeterStreams) > 0 {
		w = max(w, cfg.MeterSafeWindow)
	}
	return w + retentionReach
}

// StreamGroup is one stream and the consumer group the reaper tends on it.
type StreamGroup struct {
	Stream string
	Group  string
}

func (s StreamGroup) String() string { return s.Stream + "/" + s.Group }

// Config configures a Reaper.
type Config struct {
	Redis redis.UniversalClient // required
	// Witness is the process's ledger witness, given to the re-drives
	// (consumer.Config.Witness).
	Witness consumer.LedgerWitness
	// Paused, when set, reports an operator's pause of a stream's billing
	// (internal/streamfacts's Watcher). A paused stream is not reaped:
	// nothing claimed, re-driven, acked or dead-lettered; its pending
	// entries (a paused consumer's included) wait for the resume.
	Paused func(stream, group string) bool
	// DB reaches pelguard's ledger; required.
	DB *pgxpool.Pool
	// Schema holds pelguard's tables (default "pelguard"); it must match
	// the consumers'.
	Schema string
	// Stripe is the re-drive's Stripe adapter; required unless DryRun.
	Stripe consumer.Stripe

	Streams []StreamGroup // charge streams; this or MeterStreams required

	// MeterStreams are meter-event streams (`pelguard-consumer
	// meter-events`), decided against the meter ledger (meter.go) and
	// re-driven through the meter consumer's processing under the same
	// Namespace, Lease and Witness. MeterStripe, MeterRules and
	// MeterSafeWindow must match the meter consumers'.
	MeterStreams    []StreamGroup
	MeterStripe     consumer.MeterSender // required with MeterStreams unless DryRun
	MeterRules      event.MeterRules
	MeterSafeWindow time.Duration

	// Name is the consumer name the reaper claims to. Empty: "reaper-" plus
	// a unique per-process name, so two reapers never share a PEL.
	Name string
	// MinIdle: only entries idle at least this long are considered, and the
	// XCLAIM uses the same value as its fence.
	MinIdle time.Duration
	// Interval between passes when started with Start.
	Interval time.Duration
	// PageSize is the XPENDING COUNT, and the size of each ledger query.
	PageSize int64
	// MaxDeliveries: an entry delivered this many times goes to the dead
	// letter stream (with an alert) instead of another re-drive.
	MaxDeliveries int64
	// Workers bounds the re-drives running at once, so a slow Stripe costs
	// a pass Workers calls in parallel rather than one after another.
	Workers int
	// PageWorkers bounds the XPENDING pages decided at once: a page's
	// ledger query and Redis round trips overlap the next page's.
	PageWorkers int
	// ConsumerIdle: consumers idle longer than this with nothing pending are
	// removed from the group, and registered names gone from the group and
	// silent this long are forgotten (consumer.ForgetSilent). Zero means
	// DefaultConsumerIdle; negative disables both.
	ConsumerIdle time.Duration
	// StreamRetention: every pass trims each stream (trim.lua) to the oldest
	// entry any group on it still needs, and never past this age. Zero means
	// DefaultStreamRetention; negative disables trimming. It must be at
	// least MinStreamRetention. Dead-letter streams are never trimmed.
	StreamRetention time.Duration
	// TrimLimit bounds the entries one pass removes per stream (XTRIM's
	// LIMIT); zero means DefaultTrimLimit.
	TrimLimit int64
	// DeadLetterMax and DeadLetterMaxAge: alert when a stream's dead-letter
	// stream holds this many entries or its oldest is this old. Zero means
	// the default; negative disables that check.
	DeadLetterMax    int64
	DeadLetterMaxAge time.Duration
	// DryRun decides and reports every entry but changes nothing: no ack, no
	// claim, no dead letter, no ledger write, no Stripe call, no alert.
	DryRun bool

	// The re-drive's processing settings; see consumer.Config. They must
	// match the consumers' (Namespace above all: it is in the idempotency key).
	Namespace     string
	Lease         time.Duration
	SafeKeyWindow time.Duration
	RequireCap    bool
	Rules         event.Rules
	// OmitChargeMetadata: see consumer.Config; it must match the consumers'.
	OmitChargeMetadata bool
	// Retry is the fleet's decline and bank-debit policy (consumer.Config's
	// Retry): a decline met in a re-drive is recorded as the consumers
	// record theirs, so it must be the consumers' policy.
	Retry consumer.RetryPolicy
	// StoppedConsumers names group members that never registered as
	// pelguard consumers (a team's old consumers) and are known to be
	// stopped: their entries are decided like a dead pelguard consumer's.
	// Without it (or `consumer import` for the entry's period) such
	// entries are left alone: a consumer without a heartbeat looks the
	// same dead as inside a slow Stripe call.
	StoppedConsumers []string

	// ExternalLedger names a team's own billing table ("schema.table", the
	// article's columns customer_id, billing_period, charge_id, status; a
	// view serves another shape) that is the ledger for this reaper: the
	// team keeps its consumer and replaces only its stuck-message monitor.
	// Decisions read that table; re-drives ask Stripe first, charge as the
	// team's consumer does (Namespace, "Usage billing for {period}", no
	// metadata; the Stripe adapter must be in charges mode) and write that
	// table as it does. Liveness (StoppedConsumers, registration) does not
	// apply: MinIdle ≥ 2 × ExternalMaxCall is the guard instead. See
	// external.go.
	ExternalLedger string
	// ExternalMaxCall is the team consumer's worst-case Stripe call (its
	// client timeout × attempts); required with ExternalLedger.
	ExternalMaxCall time.Duration
	// ExternalInsert, for a table of another shape than the article's, is
	// the INSERT the team's consumer runs, with $1 customer_id, $2
	// billing_period, $3 charge_id (NULL on a decline), $4 amount_cents,
	// $5 status ('charged' or 'card_declined'), $6 error (NULL unless
	// declined). It should do nothing on a row that exists (ON CONFLICT DO
	// NOTHING). Empty: the article's INSERT.
	ExternalInsert string
	// Description is the charge description of re-drives (default the
	// seed's "Usage billing for <period>"); it must match the consumers'
	// (see consumer.DescriptionTemplate).
	Description func(event.Event) string

	// OnDecision, if set, is called for every decision, from the pass's
	// goroutine and from re-drive goroutines: it must be safe for concurrent
	// use. cmd/reaper prints dry-run decisions through it.
	OnDecision func(Decision)

	Notifier alerts.Notifier // default: log-only
	// DeadLetters, optional, turns what the reaper dead-letters (billing
	// and meter streams, and its re-drives' dead letters) into one alert
	// per stream and interval, as the consumers do.
	DeadLetters     *alerts.DeadLetterAggregator
	Metrics         *Metrics          // optional
	ConsumerMetrics *consumer.Metrics // optional: the re-drive's consumer series
	Logger          *slog.Logger      // default: discard
	Clock           clock.Clock       // default: wall clock; judges ledger leases
	// TracerProvider makes a pelguard.redrive span per re-drive, the parent
	// of the re-driven event's pelguard.event. nil: the global provider, a
	// no-op unless the binary installed the SDK.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	c.Name = cmp.Or(c.Name, "reaper-"+consumer.UniqueName())
	c.MinIdle = cmp.Or(c.MinIdle, DefaultMinIdle)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, DefaultMaxDeliveries)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.PageWorkers = cmp.Or(c.PageWorkers, DefaultPageWorkers)
	c.ConsumerIdle = cmp.Or(c.ConsumerIdle, DefaultConsumerIdle)
	c.StreamRetention = cmp.Or(c.StreamRetention, DefaultStreamRetention)
	c.TrimLimit = cmp.Or(c.TrimLimit, DefaultTrimLimit)
	c.DeadLetterMax = cmp.Or(c.DeadLetterMax, DefaultDeadLetterMax)
	c.DeadLetterMaxAge = cmp.Or(c.DeadLetterMaxAge, DefaultDeadLetterMaxAge)
	c.Namespace = cmp.Or(c.Namespace, consumer.DefaultNamespace)
	c.Lease = cmp.Or(c.Lease, consumer.DefaultLease)
	c.SafeKeyWindow = cmp.Or(c.SafeKeyWindow, consumer.DefaultSafeKeyWindow)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Notifier == nil {
		c.Notifier = alerts.NewLog(c.Logger)
	}
	c.Clock = clock.Or(c.Clock)
}

// Validate reports the first configuration error, naming the fix. It
// expects defaults to have been applied (New does).
func (c *Config) Validate() error {
	switch {
	case c.Redis == nil:
		return errors.New("reaper: Redis client is required")
	case c.DB == nil:
		return errors.New("reaper: a Postgres pool (DB) is required")
	case c.Schema != "" && pg.ValidSchema(c.Schema) != nil:
		return fmt.Errorf("reaper: --db-schema: %w", pg.ValidSchema(c.Schema))
	case c.Retry.Validate() != nil:
		return fmt.Errorf("reaper: %w", c.Retry.Validate())
	case c.Stripe == nil && !c.DryRun && len(c.Streams) > 0:
		return errors.New("reaper: Stripe client is required (only --dry-run runs without one)")
	case c.MeterStripe == nil && !c.DryRun && len(c.MeterStreams) > 0:
		return errors.New("reaper: a Stripe client for meter events is required with meter streams (only --dry-run runs without one)")
	case len(c.Streams) == 0 && len(c.MeterStreams) == 0:
		return errors.New("reaper: at least one --stream (or --meter-stream) is required")
	case c.MinIdle < time.Millisecond:
		return fmt.Errorf("reaper: --min-idle %s must be at least 1ms (it is the XCLAIM fence)", c.MinIdle)
	case c.Interval <= 0:
		return fmt.Errorf("reaper: --interval %s must be positive", c.Interval)
	case c.PageSize < 1 || c.PageSize > 10_000:
		return fmt.Errorf("reaper: --page-size %d must be between 1 and 10000", c.PageSize)
	case c.MaxDeliveries < 1:
		return fmt.Errorf("reaper: --max-deliveries %d must be at least 1", c.MaxDeliveries)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("reaper: --workers %d must be between 1 and 256", c.Workers)
	case c.PageWorkers < 1 || c.PageWorkers > 64:
		return fmt.Errorf("reaper: --page-workers %d must be between 1 and 64", c.PageWorkers)
	case c.StreamRetention > 0 && c.StreamRetention < MinStreamRetention(*c):
		return fmt.Errorf("reaper: --stream-retention %s is below %s (the safe window plus the ledger repair's reach): raise it to at least %s, or 0 to leave trimming to someone else",
			c.StreamRetention, MinStreamRetention(*c), MinStreamRetention(*c))
	case c.TrimLimit < 1:
		return fmt.Errorf("reaper: the trim limit %d must be at least 1", c.TrimLimit)
	}
	if err := c.validateExternal(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, s := range append(append([]StreamGroup(nil), c.Streams...), c.MeterStreams...) {
		if s.Stream == "" || s.Group == "" {
			return fmt.Errorf("reaper: stream %q needs a name and a group", s.String())
		}
		if seen[s.Stream] {
			// One group per stream: two Processors on one stream under the
			// same consumer name would fight over the same holds.
			return fmt.Errorf("reaper: stream %q is configured twice (one group per stream)", s.Stream)
		}
		seen[s.Stream] = true
	}
	return nil
}

// Reaper recovers abandoned entries. Drive it with Start/Stop, or call
// RunOnce for one pass.
type Reaper struct {
	cfg     Config
	tracer  trace.Tracer
	streams []*streamState

	// passMu serialises passes, so two passes never decide the same entry.
	passMu sync.Mutex
	// slots bounds concurrent re-drives.
	slots chan struct{}
	// redrives tracks every re-drive goroutine, for Stop and RunOnce.
	redrives sync.WaitGroup

	mu       sync.Mutex
	inFlight map[string]bool // stream + "\x00" + id
	ledger   *ledger.Ledger
	// meters are Config.MeterStreams; meterLedger reads their rows.
	meters      []*meterStream
	meterLedger *meterledger.Ledger
	// team is the team's table in the external-ledger mode; nil otherwise.
	team *teamTable
	// imported is the set of periods with imported history, read each pass;
	// stopped is Config.StoppedConsumers; alerted, the unregistered
	// consumers already named in an alert.
	imported map[string]bool
	stopped  map[string]bool
	alerted  map[string]bool
	svc      startstop.Service
}

type streamState struct {
	StreamGroup
	proc *consumer.Processor // nil in dry-run

	// Read at the start of each pass (passes never overlap): the group's
	// registered pelguard consumers, and the owners of this pass's
	// unregistered_consumer entries with their counts.
	registered   map[string]bool
	unregistered map[string]int
	unregMu      sync.Mutex

	// gone is this pass's pending entries acked because their bodies were
	// gone (noteGone), alerted at the end of the pass (reportGone).
	gone   goneSpan
	goneMu sync.Mutex
	// lossSeen is the last loss alerted per group (lossKey), so a loss is
	// alerted once, not every pass; deadAlerted, when the dead letters were
	// last alerted. Only the pass's own goroutine touches them.
	lossSeen    map[string]string
	deadAlerted time.Time
	// intact is, per group that has read nothing (entries-read null), the
	// entries the stream had lost (entries-added − length) when a pass last
	// saw no gap under the group (detectLoss).
	intact map[string]int64
}

// New validates cfg and builds a Reaper.
func New(cfg Config) (*Reaper, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MinIdle <= cfg.Lease/3 {
		// Legal (tests do it), but then the re-drive's own heartbeat (every
		// Lease/3) cannot keep its entries from looking idle to other reapers:
		// the ledger lease is left as the only fence.
		cfg.Logger.Warn("reaper: --min-idle is not above the re-drive heartbeat interval (lease/3)",
			slog.Duration("min_idle", cfg.MinIdle), slog.Duration("lease", cfg.Lease))
	}
	r := &Reaper{tracer: tracing.Tracer(cfg.TracerProvider),
		cfg:      cfg,
		ledger:   witnessed(ledger.New(cfg.DB, cfg.Schema, cfg.Clock), cfg.Witness),
		stopped:  stoppedSet(cfg.StoppedConsumers),
		alerted:  map[string]bool{},
		slots:    make(chan struct{}, cfg.Workers),
		inFlight: map[string]bool{},
	}
	if cfg.ExternalLedger != "" {
		t, _ := parseTeamTable(cfg.ExternalLedger) // checked by Validate
		t.insertSQL = cfg.ExternalInsert
		r.team = &t
	}
	for _, sg := range cfg.Streams {
		st := &streamState{StreamGroup: sg}
		if !cfg.DryRun && r.team == nil {
			// One Processor per stream: its Config names the stream and
			// group, and it acts under the reaper's own consumer name, the
			// name the XCLAIM hands entries to.
			p, err := consumer.NewProcessor(consumer.Config{
				Redis: cfg.Redis, DB: cfg.DB, Schema: cfg.Schema, Stripe: cfg.Stripe,
				Stream: sg.Stream, Group: sg.Group, Name: cfg.Name,
				Namespace: cfg.Namespace, Lease: cfg.Lease, SafeKeyWindow: cfg.SafeKeyWindow,
				RequireCap: cfg.RequireCap, Rules: cfg.Rules, OmitChargeMetadata: cfg.OmitChargeMetadata, Description: cfg.Description,
				Retry: cfg.Retry, Witness: cfg.Witness,
				Notifier: cfg.Notifier, DeadLetters: cfg.DeadLetters, Metrics: cfg.ConsumerMetrics, Logger: cfg.Logger, Clock: cfg.Clock,
				TracerProvider: cfg.TracerProvider,
			})
			if err != nil {
				return nil, fmt.Errorf("reaper: building the re-drive processor for %s: %w", sg, err)
			}
			st.proc = p
		}
		r.streams = append(r.streams, st)
	}
	if err := r.newMeterStreams(); err != nil {
		return nil, err
	}
	return r, nil
}

// Name is the consumer name the reaper claims entries to.
func (r *Reaper) Name() string { return r.cfg.Name }

// Errors from Start (the shared start/stop contract).
var (
	ErrAlreadyStarted = startstop.ErrAlreadyStarted
	ErrStopped        = startstop.ErrStopped
)

// Start runs a pass at once and then every Interval, in the background,
// until Stop. The passes do not wait for their re-drives: those run on up to
// Workers goroutines, and the next pass skips entries still in flight.
// Re-drives outlive the caller's ctx on purpose: once a Stripe call is made
// its outcome must be recorded. Only Stop's deadline cancels them.
func (r *Reaper) Start(ctx context.Context) error {
	return r.svc.Start(ctx, func(loopCtx, workCtx context.Context) error {
		stopHB := r.runHeartbeats(workCtx)
		defer stopHB()
		r.loop(loopCtx, workCtx)
		r.redrives.Wait()
		return nil
	})
}

// Stop ends the loop and waits for re-drives in progress to finish (their
// Stripe calls and ledger writes complete). If ctx ends first, re-drives are
// cancelled (their entries stay pending, safe to redeliver) and ctx's error is
// returned. Stop is idempotent and safe before Start.
func (r *Reaper) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

func (r *Reaper) loop(ctx, workCtx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.runOnce(ctx, workCtx, nil); err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "reaper pass failed; retrying next interval", slog.Any("error", err))
		}
		t.Reset(r.cfg.Interval)
	}
}

// runHeartbeats keeps the re-drive processors' holds alive until the
// returned func is called.
func (r *Reaper) runHeartbeats(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, st := range r.streams {
		if st.proc == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.proc.RunHeartbeat(ctx)
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// RunOnce runs one pass over every stream and waits for the re-drives it
// started, counting their outcomes. It is what --once, the drill and tests
// use; it may be called without Start.
func (r *Reaper) RunOnce(ctx context.Context) (PassSummary, error) {
	// The heartbeat runs for this call alone; with Start also running, two
	// heartbeats renew the same holds, which is harmless.
	stopHB := r.runHeartbeats(ctx)
	defer stopHB()
	var wg sync.WaitGroup // runOnce waits on it before summing up
	return r.runOnce(ctx, ctx, &wg)
}

func (r *Reaper) decide(d Decision) {
	r.cfg.Metrics.decision(d.Stream, d.Kind)
	if r.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
		r.cfg.Logger.Debug("reaper decision",
			slog.String("stream", d.Stream), slog.String("id", d.ID), slog.String("kind", string(d.Kind)),
			slog.String("consumer", d.Consumer), slog.Duration("idle", d.Idle), slog.Int64("deliveries", d.Deliveries),
			slog.String("key", d.Key), slog.String("reason", d.Reason), slog.String("outcome", string(d.Outcome)),
			slog.String("error", d.Error), slog.Bool("dry_run", d.DryRun))
	}
	if r.cfg.OnDecision != nil {
		r.cfg.OnDecision(d)
	}
}

// witnessed is l with the process's witness, when it has one.
func witnessed(l *ledger.Ledger, m consumer.LedgerWitness) *ledger.Ledger {
	if m != nil {
		l.SetWitness(m)
	}
	return l
}

// paused reports whether the stream's billing is paused by an operator.
func (r *Reaper) paused(sg StreamGroup) bool {
	return r.cfg.Paused != nil && r.cfg.Paused(sg.Stream, sg.Group)
}
