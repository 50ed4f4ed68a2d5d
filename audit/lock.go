package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/pg"
)

// The auditor's locks are leases: rows of run_leases (migration 00020)
// with an owner, an expiry and a heartbeat, like the ledger's own leases
// on billing_records. A Postgres session advisory lock would belong to the
// connection that took it, and behind a transaction-mode pooler
// (PgBouncer, the managed poolers) that connection is the pooler's: it
// outlives the run and keeps the lock for whoever is handed it next, so
// every later run waits and fails. A row has no such owner: the run
// releases it, and a run that was killed frees it when its lease expires.
//
// Runs and refunds take different leases: a refund may run while a
// scheduled run lists Stripe, but two runs (which would both count the same
// new findings and alert twice) or two refund runs (which would race for the
// same caps) may not. Each schema has its own run_leases, so two pelguard
// ledgers in one database (one per schema, as every test has) audit
// independently.
const (
	lockRun    = "audit_run"
	lockRefund = "refund"
	lockUsage  = "usage_reconciliation"
)

// DefaultLockLease is how long a lease lasts without a heartbeat: how long
// a killed run blocks the next one at most. The holder renews it every
// third of that.
const DefaultLockLease = time.Minute

// MinLockLease is the shortest lease accepted: a heartbeat every third of
// it must have time for a round trip to Postgres.
const MinLockLease = 3 * time.Second

// ErrLeaseLost is the cause a run stops with when its lease could not be
// renewed (someone took it over after it expired, or Postgres did not
// answer): it writes nothing more.
var ErrLeaseLost = errors.New("the audit lock's lease was lost")

// heldLock is a lease this process holds. Its context (ctx) ends, with
// ErrLeaseLost as the cause, as soon as a heartbeat fails: everything the
// holder writes goes through that context, so it stops before its next
// write, while the lease it last renewed is still live.
type heldLock struct {
	db    pg.DB
	name  string
	owner string
	epoch int64
	lease time.Duration
	log   *slog.Logger

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

type leaseKey struct{}

// heldLease is the innermost lease ctx was derived under (nil: none).
func heldLease(ctx context.Context) *heldLock {
	l, _ := ctx.Value(leaseKey{}).(*heldLock)
	return l
}

// leaseOwner names this process in run_leases, for the operator who finds
// a lease held: host, pid and a random part (two Auditors of one process
// are two owners).
func leaseOwner() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + strconv.FormatUint(rand.Uint64()>>32, 36)
}

const (
	acquireLeaseSQL = `INSERT INTO {schema}.run_leases AS l (name, owner, epoch, acquired_at, heartbeat_at, expires_at)
		VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp(), clock_timestamp() + $3::bigint * interval '1 millisecond')
		ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1, acquired_at = excluded.acquired_at,
			heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at
		WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
		RETURNING epoch`
	holderSQL = `SELECT coalesce(owner, ''), coalesce(expires_at, clock_timestamp()) FROM {schema}.run_leases WHERE name = $1`
	renewSQL  = `UPDATE {schema}.run_leases SET heartbeat_at = clock_timestamp(),
			expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
		WHERE name = $1 AND owner = $2 AND epoch = $3 AND expires_at > clock_timestamp()`
	releaseSQL = `UPDATE {schema}.run_leases SET owner = NULL, heartbeat_at = NULL, expires_at = NULL
		WHERE name = $1 AND owner = $2 AND epoch = $3`
	// stillHeldSQL is the fence of a write that must not outlive the
	// lease (a refund's record): in the write's own transaction, and
	// FOR SHARE so that a takeover waits for it to commit.
	stillHeldSQL = `SELECT 1 FROM {schema}.run_leases WHERE name = $1 AND owner = $2 AND epoch = $3
		AND expires_at > clock_timestamp() FOR SHARE`
)

// acquireLock takes the lease name, waiting up to wait (0: not at all) for
// its holder to release it or for its lease to expire. It returns an error
// wrapping ErrLocked when someone else still holds it. The lease is renewed
// every lease/3 until release; ctx's end ends the lease's context too.
func acquireLock(ctx context.Context, db pg.DB, name string, lease, wait time.Duration, log *slog.Logger) (*heldLock, error) {
	owner := leaseOwner()
	deadline := time.Now().Add(wait)
	for {
		var epoch int64
		err := db.QueryRow(ctx, acquireLeaseSQL, name, owner, lease.Milliseconds()).Scan(&epoch)
		if err == nil {
			return startLease(ctx, db, name, owner, epoch, lease, log), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("taking the audit lock %s: %w", name, err)
		}
		if !time.Now().Before(deadline) {
			var holder string
			var until time.Time
			if err := db.QueryRow(ctx, holderSQL, name).Scan(&holder, &until); err != nil {
				return nil, ErrLocked
			}
			return nil, fmt.Errorf("%w (%s held by %s until %s unless renewed)", ErrLocked, name, holder, until.UTC().Format(time.RFC3339))
		}
		t := time.NewTimer(min(time.Until(deadline), 200*time.Millisecond+rand.N(100*time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for the audit lock %s: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// lock takes the lease name for this Auditor's run.
func (a *Auditor) lock(ctx context.Context, name string, wait time.Duration) (*heldLock, error) {
	return acquireLock(ctx, a.store.pool, name, a.cfg.LockLease, wait, a.log)
}

func startLease(parent context.Context, db pg.DB, name, owner string, epoch int64, lease time.Duration, log *slog.Logger) *heldLock {
	l := &heldLock{db: db, name: name, owner: owner, epoch: epoch, lease: lease, log: log,
		stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancelCause(parent)
	l.ctx, l.cancel = context.WithValue(ctx, leaseKey{}, l), cancel
	go l.heartbeat()
	return l
}

// heartbeat renews the lease every third of it. The first renewal that
// fails (the lease was taken over, or Postgres did not answer within a
// third of the lease) cancels the holder's context: a third of the lease
// is still left then, so the holder has stopped before anyone may take
// the lease over.
func (l *heldLock) heartbeat() {
	defer close(l.done)
	every := l.lease / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, every)
		tag, err := l.db.Exec(ctx, renewSQL, l.name, l.owner, l.epoch, l.lease.Milliseconds())
		cancel()
		if err == nil && tag.RowsAffected() == 1 {
			continue
		}
		if l.ctx.Err() != nil { // the holder is done (or its caller gave up): nothing lost
			return
		}
		cause := fmt.Errorf("%w: %s (owner %s, epoch %d) was taken over", ErrLeaseLost, l.name, l.owner, l.epoch)
		if err != nil {
			cause = fmt.Errorf("%w: renewing %s: %w", ErrLeaseLost, l.name, err)
		}
		l.log.Error("audit lock lost; stopping before the next write", slog.String("lock", l.name), slog.Any("error", cause))
		l.cancel(cause)
		return
	}
}

// checkHeld fences a write in tx: it fails with ErrLeaseLost unless the
// lease is still this holder's and live, and keeps a takeover waiting
// until tx ends.
func (l *heldLock) checkHeld(ctx context.Context, tx pgx.Tx) error {
	var one int
	err := tx.QueryRow(ctx, stillHeldSQL, l.name, l.owner, l.epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s (owner %s, epoch %d) expired or was taken over", ErrLeaseLost, l.name, l.owner, l.epoch)
	}
	if err != nil {
		return fmt.Errorf("checking the audit lock %s: %w", l.name, err)
	}
	return nil
}

// lost is the cause the lease's context ended with when its heartbeat
// failed, or nil.
func (l *heldLock) lost() error {
	if c := context.Cause(l.ctx); errors.Is(c, ErrLeaseLost) {
		return c
	}
	return nil
}

// release stops the heartbeat and gives the lease up. If that fails the
// lease simply expires. A second call does nothing.
func (l *heldLock) release() { l.once.Do(l.doRelease) }

func (l *heldLock) doRelease() {
	close(l.stop)
	<-l.done
	l.cancel(context.Canceled)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.db.Exec(ctx, releaseSQL, l.name, l.owner, l.epoch); err != nil {
		l.log.Warn("releasing the audit lock failed; it expires by itself", slog.String("lock", l.name),
			slog.Duration("lease", l.lease), slog.Any("error", err))
	}
}
