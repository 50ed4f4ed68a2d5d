package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/redisurl"
)

// DefaultWaitForDeps is how long a binary waits, by default, for Redis and
// Postgres to answer at start: long enough for a host's boot or a pod
// scheduled beside a restarting database, short enough that a wrong address
// fails a deploy within a minute.
const DefaultWaitForDeps = 60 * time.Second

// Backoff bounds: the first retry comes after backoffFirst, each next one
// after twice as long, never more than backoffMax apart.
const (
	backoffFirst = 250 * time.Millisecond
	backoffMax   = 5 * time.Second
)

// RegisterWait adds --wait-for-deps.
func RegisterWait(fs *flag.FlagSet, dst *time.Duration) {
	fs.DurationVar(dst, "wait-for-deps", EnvDuration("PELGUARD_WAIT_FOR_DEPS", DefaultWaitForDeps),
		"at start, retry Redis and Postgres this long (exponential backoff, one log line per failed try)\n"+
			"before exiting 3; 0: one try [PELGUARD_WAIT_FOR_DEPS]")
}

// ValidateWait checks a --wait-for-deps value.
func ValidateWait(d time.Duration) error {
	if d < 0 {
		return Usagef("--wait-for-deps %s must not be negative (0: one try, no wait)", d)
	}
	return nil
}

// Dep is a service a binary needs before it starts.
type Dep struct {
	Name string // "Redis", "Postgres"
	Addr string // where, printable: no credentials
	Env  string // the variable that names it, for the hint: "REDIS_URL"
	// Ping tries it once. Its context carries the per-try timeout.
	Ping func(ctx context.Context) error
	// Permanent reports an answer no retry can change (a wrong password, a
	// database that does not exist): the wait ends at once, exit 2.
	Permanent func(error) bool
	// TryTimeout bounds one Ping; default 5s.
	TryTimeout time.Duration
}

// UnavailableError is a dependency that did not answer within the wait.
// Fail maps it to ExitUnavailable.
type UnavailableError struct {
	Dep, Addr, Env string
	Wait           time.Duration // --wait-for-deps
	Tries          int
	Err            error // the last try's error, redacted
}

func (e *UnavailableError) Error() string {
	within := ""
	if e.Wait > 0 {
		tries := fmt.Sprintf("%d tries", e.Tries)
		if e.Tries == 1 {
			tries = "1 try"
		}
		within = fmt.Sprintf(" within --wait-for-deps %s (%s)", e.Wait, tries)
	}
	return fmt.Sprintf("%s at %s did not answer%s; is it running? is %s right?: %v", e.Dep, e.Addr, within, e.Env, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Waiter waits for dependencies at start.
type Waiter struct {
	// For is the whole budget, from the first try (--wait-for-deps). 0:
	// one try each.
	For    time.Duration
	Logger *slog.Logger

	// Test hooks: the clock and the sleep between tries.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// Wait tries each dependency in turn until it answers, with exponential
// backoff, within one budget (For) shared by all of them. Each failed try
// that is retried logs one line (warn); a dependency that answers after
// failing logs one more (info). It returns nil when all answered, an
// *UnavailableError when the budget ran out, a plain error (the
// configuration is wrong) when one answered with a permanent error, and
// ctx's error when ctx ended first (SIGTERM while waiting).
func (w Waiter) Wait(ctx context.Context, deps ...Dep) error {
	now, sleep := w.now, w.sleep
	if now == nil {
		now = time.Now
	}
	if sleep == nil {
		sleep = sleepCtx
	}
	logger := w.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := now()
	deadline := start.Add(w.For)
	for _, d := range deps {
		for try := 1; ; try++ {
			tctx, cancel := context.WithTimeout(ctx, cmpDuration(d.TryTimeout, 5*time.Second))
			err := d.Ping(tctx)
			cancel()
			if err == nil {
				if try > 1 {
					logger.Info(d.Name+" answers", slog.String("addr", d.Addr), slog.Int("tries", try),
						slog.String("waited", now().Sub(start).Round(time.Millisecond).String()))
				}
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			err = redact.Error(err)
			if d.Permanent != nil && d.Permanent(err) {
				return fmt.Errorf("connecting to %s at %s (is %s right?): %w", d.Name, d.Addr, d.Env, err)
			}
			remaining := deadline.Sub(now())
			if remaining <= 0 {
				return &UnavailableError{Dep: d.Name, Addr: d.Addr, Env: d.Env, Wait: w.For, Tries: try, Err: err}
			}
			delay := min(Backoff(try), remaining)
			// Durations as text ("250ms"): a JSON handler prints a
			// slog.Duration as integer nanoseconds, which nobody reads.
			logger.Warn("waiting for "+d.Name, slog.String("addr", d.Addr), slog.Int("try", try),
				slog.String("retry_in", delay.Round(time.Millisecond).String()), slog.Any("error", err))
			if err := sleep(ctx, delay); err != nil {
				return err
			}
		}
	}
	return nil
}

// Backoff is the pause after failed try n (1-based): 250ms, 500ms, 1s, 2s,
// 4s, then 5s.
func Backoff(n int) time.Duration {
	d := backoffFirst
	for i := 1; i < n && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// postgresPermanent: Postgres itself answered and refused (bad password,
// unknown role or database, no pg_hba entry). Every other error — refused
// or reset connections, timeouts, DNS, "the database system is starting
// up", too many connections — may pass with time.
func postgresPermanent(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	if pg.PoolerRefused(err) {
		return true // the pooler refuses the URL's parameters every time
	}
	switch pe.Code {
	case "57P03", // cannot_connect_now: starting up, shutting down, in recovery
		"53300", // too_many_connections
		"57P01", // admin_shutdown
		"57P02": // crash_shutdown
		return false
	}
	return len(pe.Code) < 2 || pe.Code[:2] != "08" // connection exceptions are transient
}

// redisPermanent: Redis answered with an error that retrying cannot change
// (WRONGPASS, NOAUTH, NOPERM, an unknown database). LOADING (reading its
// dataset at start), BUSY, MASTERDOWN and cluster reconfiguration pass.
func redisPermanent(err error) bool {
	var re redis.Error
	// A master name the sentinels do not know yet (redis.Nil, a redis.Error
	// too) may be one they are about to be told of: wait, then exit 3.
	if !errors.As(err, &re) || redisurl.MasterUnknown(err) {
		return false
	}
	for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"} {
		if redis.HasErrorPrefix(err, p) {
			return false
		}
	}
	return true
}
