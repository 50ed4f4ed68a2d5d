// Package rollback notices a ledger that went back in time and repairs it
// with no one in the loop (DESIGN.md "The ledger's own losses").
//
// Postgres is pelguard's truth, but a failover to an asynchronous replica
// (or a restore from a backup) erases the last commits while Redis has
// acked their entries and Stripe has made their charges. Every process
// keeps a witness of the ledger's progress outside Postgres: its row in
// ledger_witness is bumped inside each ledger transaction whose effect
// leaves Postgres, and the committed value is kept in memory and mirrored
// to Redis before that effect (Mirror, before every XACK). A Monitor
// compares what Postgres holds with what was witnessed — on every new
// connection (a failover breaks them all, so no statement reaches a new
// primary before the check) and every second — and on a loss, in one
// transaction: raises the epoch floor past anything the lost history could
// have issued, fences every pending and processing row and external lease,
// and records the rollback. While a rollback is unrepaired, Suspect is
// true: the consumers ask Stripe before every charge. A process with a
// Stripe client then repairs the ledger from Stripe (Config.Repair) and
// closes the rollback.
package rollback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/pg"
)

// Defaults.
const (
	// DefaultEvery is how often a Monitor compares, besides on every new
	// connection.
	DefaultEvery = time.Second
	// DefaultMargin is how far before the last surviving witness stamp the
	// repair starts reading Stripe.
	DefaultMargin = 5 * time.Minute
	// MergeWithin: a detection this soon after the last recorded rollback,
	// or while it is not yet repaired, is the same failover seen by another
	// process (its memory held other witnesses): its evidence joins that
	// rollback, with no second alert.
	MergeWithin = 10 * time.Minute
	// fenceStride is how far a rollback raises the epoch floor: past any
	// epoch the lost history could have handed out (a row is taken over
	// far fewer than 2^32 times).
	fenceStride = int64(1) << 32
	// repairStale: a repair claimed longer ago than this by a process that
	// did not finish is claimed again (the repair is idempotent).
	repairStale = 10 * time.Minute
	// PruneAfter: witness rows of writers idle this long (processes that
	// ended: a pod's name is new at every start) are deleted, from Redis
	// first. A process forgets a value it has not seen change for
	// forgetAfter, a day sooner, so a pruned row is never evidence.
	PruneAfter  = 7 * 24 * time.Hour
	forgetAfter = PruneAfter - 24*time.Hour
	pruneEvery  = time.Hour
)

// RepairReport is what a repair did.
type RepairReport struct {
	Rebuilt, Repaired, RefundsRebuilt, Findings int
	Notes                                       string
}

// RepairFunc rebuilds from Stripe what the ledger lost since since. It must
// be idempotent and safe to run from two processes at once.
type RepairFunc func(ctx context.Context, since time.Time) (RepairReport, error)

// Config configures a Monitor.
type Config struct {
	// Schema holds the ledger (default pg.DefaultSchema).
	Schema string
	// Writer names this process's witness row: role and name
	// ("consumer/billing-7f9c"). Required.
	Writer string
	// Redis mirrors the witness (optional: without it, only this process's
	// memory witnesses, which a restart forgets).
	Redis redis.UniversalClient
	// Repair is set in roles with a Stripe client (consumer, reaper,
	// auditor); without it the process detects and fences, and leaves the
	// repair to them.
	Repair   RepairFunc
	Notifier alerts.Notifier
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Clock    clock.Clock
	Every    time.Duration // DefaultEvery
	Margin   time.Duration // DefaultMargin
}

// Monitor keeps one process's witness and watches the ledger.
type Monitor struct {
	cfg Config
	db  pg.DB // set by Start; the checks on a new connection use the connection

	mu        sync.Mutex
	ledgerID  string
	mem       map[string]seen // every witness value this process saw committed
	committed atomic.Int64    // this writer's last committed value
	server    atomic.Int64    // the server of the last check that passed (ledger.ServerFence)
	mirrored  atomic.Int64    // the highest value of ours Redis confirmed
	mirrorMu  sync.Mutex

	rechecks atomic.Int64 // Recheck calls

	gen     atomic.Uint64 // numbers the checks' reads, in the order they begin
	stateMu sync.Mutex    // orders the checks' results (apply)
	applied uint64        // the newest read whose result is applied

	open      atomic.Bool
	lostSince atomic.Int64 // unix nanos of the open rollbacks' lost_since
	repairAt  time.Time    // local backoff after a failed repair
	repairGap time.Duration
	pruneAt   time.Time

	stop func()        // ends run (Close)
	done chan struct{} // closed when run has returned

	metrics *metrics
}

// New returns a Monitor; use AfterConnect in the pool's config, then Start.
func New(cfg Config) (*Monitor, error) {
	if cfg.Writer == "" {
		return nil, errors.New("rollback: a ledger writer (Writer) is required")
	}
	if cfg.Schema == "" {
		cfg.Schema = pg.DefaultSchema
	}
	if err := pg.ValidSchema(cfg.Schema); err != nil {
		return nil, fmt.Errorf("rollback: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Margin <= 0 {
		cfg.Margin = DefaultMargin
	}
	cfg.Clock = clock.Or(cfg.Clock)
	m := &Monitor{cfg: cfg, mem: map[string]seen{}, db: pg.NewDB(nil, cfg.Schema)}
	m.metrics = newMetrics(cfg.Registry)
	return m, nil
}

// SetRepair gives the monitor its repair (Config.Repair), for roles whose
// Stripe client is built after the pool. Call it before Start.
func (m *Monitor) SetRepair(fn RepairFunc) { m.cfg.Repair = fn }

// SetNotifier gives the monitor its alerts (Config.Notifier), for roles
// whose notifier is made after the pool. Call it before Start.
func (m *Monitor) SetNotifier(n alerts.Notifier) { m.cfg.Notifier = n }

// Writer is this process's witness row (ledger.Witness).
func (m *Monitor) Writer() string { return m.cfg.Writer }

// Committed records a committed bump of our row (ledger.Witness).
func (m *Monitor) Committed(seq int64) {
	for {
		cur := m.committed.Load()
		if seq <= cur || m.committed.CompareAndSwap(cur, seq) {
			break
		}
	}
	m.mu.Lock()
	m.see(m.cfg.Writer, seq, m.cfg.Clock.Now())
	m.mu.Unlock()
}

// CheckedServer is the server the last passing check ran on
// (ledger.ServerFence).
func (m *Monitor) CheckedServer() int64 { return m.server.Load() }

// Recheck runs the check now, on the pool Start was given
// (ledger.ServerFence).
func (m *Monitor) Recheck(ctx context.Context) error {
	if m.db.Pool == nil {
		return nil // not started: the checks on each connection still run
	}
	m.rechecks.Add(1)
	m.metrics.rechecks.Inc()
	return m.check(ctx, m.db.Pool)
}

// Rechecks is how many times a ledger write made the check run (Recheck).
func (m *Monitor) Rechecks() int64 { return m.rechecks.Load() }

// Suspect reports whether the ledger may be missing rows: a rollback is
// recorded and not yet repaired. Charges ask Stripe first while it lasts.
func (m *Monitor) Suspect() bool { return m != nil && m.open.Load() }

// LostSince is where the open rollbacks' losses begin (zero when none): a
// look-up before charging reads Stripe from here at least.
func (m *Monitor) LostSince() time.Time {
	if m == nil || !m.open.Load() {
		return time.Time{}
	}
	return time.Unix(0, m.lostSince.Load())
}

// Mirror makes Redis hold at least our last committed value: call it after
// the commit and before the effect it witnesses (the XACK). Concurrent
// callers share one round trip. Without Redis it does nothing.
func (m *Monitor) Mirror(ctx context.Context) error {
	if m == nil || m.cfg.Redis == nil {
		return nil
	}
	seq := m.committed.Load()
	if seq <= m.mirrored.Load() {
		return nil
	}
	m.mirrorMu.Lock()
	defer m.mirrorMu.Unlock()
	seq = m.committed.Load()
	if seq <= m.mirrored.Load() {
		return nil
	}
	id := m.ledger()
	if id == "" {
		return nil // no check has run yet: nothing to key the mirror by
	}
	if err := raiseScript.Run(ctx, m.cfg.Redis, []string{redisKey(id)}, m.cfg.Writer, seq).Err(); err != nil {
		return fmt.Errorf("mirroring the ledger witness to Redis: %w", err)
	}
	m.mirrored.Store(seq)
	return nil
}

func (m *Monitor) ledger() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ledgerID
}

// AfterConnect is for pgxpool.Config.AfterConnect: every new connection is
// checked before it is handed out, so after a failover (which breaks every
// connection) no statement reaches the new primary before the fence. A
// ledger without migration 00012 yet passes (nothing to witness).
func (m *Monitor) AfterConnect(ctx context.Context, c *pgx.Conn) error {
	err := m.check(ctx, c)
	if err != nil {
		m.cfg.Logger.Warn("checking the ledger for a rollback on a new connection", "err", err)
	}
	return err
}

// Start runs the monitor on pool until ctx ends or Close: a check now
// (returned), then one every Config.Every, and the repair of open
// rollbacks when Config.Repair is set. Call it once.
func (m *Monitor) Start(ctx context.Context, pool *pgxpool.Pool) error {
	m.db = pg.NewDB(pool, m.cfg.Schema)
	err := m.check(ctx, pool)
	ctx, m.stop = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		m.run(ctx)
	}()
	return err
}

// closeWait bounds how long Close waits for a check in flight.
const closeWait = 5 * time.Second

// Close stops the checks Start began and waits for them (a check in flight
// finishes, within closeWait; a repair in progress is cancelled); the
// witness keeps serving Committed and Mirror. Call it before closing the
// pool.
func (m *Monitor) Close() {
	if m == nil || m.stop == nil {
		return
	}
	m.stop()
	<-m.done
}

func (m *Monitor) run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Every)
	defer t.Stop()
	for {
		if m.open.Load() && m.cfg.Repair != nil {
			m.tryRepair(ctx)
		}
		if now := m.cfg.Clock.Now(); now.After(m.pruneAt) {
			m.pruneAt = now.Add(pruneEvery)
			m.prune(ctx, now)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Close lets a check in flight finish (bounded) instead of
		// interrupting its statement: pgx closes an interrupted connection
		// with a cancel request, which a process exiting right after can
		// leave half-sent to a connection pooler (PgBouncer 1.18 exits on it).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeWait)
		if err := m.check(cctx, m.db.Pool); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("checking the ledger for a rollback", "err", err)
		}
		cancel()
	}
}

// Check runs one comparison now (tests, and callers that just reconnected).
func (m *Monitor) Check(ctx context.Context) error { return m.check(ctx, m.db.Pool) }
