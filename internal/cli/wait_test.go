package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i, w := range want {
		if got := Backoff(i + 1); got != w {
			t.Errorf("Backoff(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := Backoff(1000); got != backoffMax {
		t.Errorf("Backoff(1000) = %s", got)
	}
}

// fakeTime is a clock the Waiter's sleeps advance: the tests wait for
// nothing.
type fakeTime struct{ now time.Time }

func (f *fakeTime) Now() time.Time { return f.now }
func (f *fakeTime) Sleep(_ context.Context, d time.Duration) error {
	f.now = f.now.Add(d)
	return nil
}

func waiter(budget time.Duration, logs *bytes.Buffer) (Waiter, *fakeTime) {
	ft := &fakeTime{now: time.Unix(1_800_000_000, 0)}
	return Waiter{For: budget, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{ReplaceAttr: redactAttr})),
		now: ft.Now, sleep: ft.Sleep}, ft
}

var errRefused = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

// A dependency that answers on the fourth try: three warn lines (try 1..3,
// with the backoff), one "answers" line, nil.
func TestWaiterRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	w, ft := waiter(time.Minute, &logs)
	start := ft.now
	tries := 0
	dep := Dep{Name: "Postgres", Addr: "db:5432", Env: "DATABASE_URL", Permanent: postgresPermanent,
		Ping: func(context.Context) error {
			if tries++; tries < 4 {
				return errRefused
			}
			return nil
		}}
	if err := w.Wait(context.Background(), dep); err != nil {
		t.Fatal(err)
	}
	if got := ft.now.Sub(start); got != 1750*time.Millisecond {
		t.Errorf("waited %s, want 250ms+500ms+1s", got)
	}
	s := logs.String()
	if n := strings.Count(s, `msg="waiting for Postgres"`); n != 3 {
		t.Errorf("%d waiting lines, want 3:\n%s", n, s)
	}
	for _, want := range []string{"try=1 retry_in=250ms", "try=3 retry_in=1s", `msg="Postgres answers" addr=db:5432 tries=4`} {
		if !strings.Contains(s, want) {
			t.Errorf("logs lack %q:\n%s", want, s)
		}
	}
}

// The budget bounds the wait: the last pause is cut to what is left, then
// an *UnavailableError (ExitUnavailable) says how long and how many tries.
// With a budget of 0, one try.
func TestWaiterGivesUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		budget time.Duration
		tries  int
	}{{0, 1}, {2 * time.Second, 5}, {10 * time.Second, 7}} {
		var logs bytes.Buffer
		w, ft := waiter(tc.budget, &logs)
		start := ft.now
		tries := 0
		err := w.Wait(context.Background(), Dep{Name: "Redis", Addr: "r:6379", Env: "REDIS_URL", Permanent: redisPermanent,
			Ping: func(context.Context) error { tries++; return errRefused }})
		var ue *UnavailableError
		if !errors.As(err, &ue) || ue.Tries != tc.tries || tries != tc.tries {
			t.Fatalf("budget %s: %v (%d tries), want an UnavailableError after %d", tc.budget, err, tries, tc.tries)
		}
		if got := ft.now.Sub(start); got != tc.budget {
			t.Errorf("budget %s: waited %s", tc.budget, got)
		}
		if n := strings.Count(logs.String(), "waiting for Redis"); n != tc.tries-1 {
			t.Errorf("budget %s: %d log lines, want one per retried try (%d)", tc.budget, n, tc.tries-1)
		}
		if code := Fail(&bytes.Buffer{}, "consumer", err); code != ExitUnavailable {
			t.Errorf("exit %d, want %d", code, ExitUnavailable)
		}
		if tc.budget > 0 && !strings.Contains(err.Error(), fmt.Sprintf("within --wait-for-deps %s (%d tries)", tc.budget, tc.tries)) {
			t.Errorf("message: %v", err)
		}
	}
}

// An answer no retry can change ends the wait at once with a plain error
// (exit 2); ctx ending (SIGTERM) ends it with ctx's error.
func TestWaiterPermanentAndCancel(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	w, _ := waiter(time.Minute, &logs)
	authErr := &pgconn.PgError{Code: "28P01", Message: "password authentication failed for user \"billing\""}
	tries := 0
	err := w.Wait(context.Background(), Dep{Name: "Postgres", Addr: "db:5432", Env: "DATABASE_URL", Permanent: postgresPermanent,
		Ping: func(context.Context) error { tries++; return fmt.Errorf("failed to connect: %w", authErr) }})
	var ue *UnavailableError
	if err == nil || errors.As(err, &ue) || tries != 1 || !strings.Contains(err.Error(), "password authentication failed") {
		t.Fatalf("%v after %d tries, want a plain error after one", err, tries)
	}
	if code := Fail(&bytes.Buffer{}, "consumer", err); code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}

	ctx, cancel := context.WithCancel(context.Background())
	w.sleep = func(context.Context, time.Duration) error { cancel(); return ctx.Err() }
	err = w.Wait(ctx, Dep{Name: "Redis", Ping: func(context.Context) error { return errRefused }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want context.Canceled", err)
	}
}

// What is permanent: Postgres or Redis refusing us for a reason time does
// not change. Everything else — the network, a server starting — passes.
func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "28P01"}, true},  // invalid_password
		{&pgconn.PgError{Code: "3D000"}, true},  // invalid_catalog_name: no such database
		{&pgconn.PgError{Code: "57P03"}, false}, // the database system is starting up
		{&pgconn.PgError{Code: "53300"}, false}, // too_many_connections
		{&pgconn.PgError{Code: "08006"}, false}, // connection_failure
		{errRefused, false},
		{context.DeadlineExceeded, false},
	} {
		if got := postgresPermanent(fmt.Errorf("wrapped: %w", tc.err)); got != tc.want {
			t.Errorf("postgres %v: permanent %v, want %v", tc.err, got, tc.want)
		}
	}
	// Real Redis errors, from the server this test suite runs against.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", Username: "no-such-user", Password: "x", MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err == nil || !redisPermanent(err) {
		t.Errorf("Redis refusing the user: %v, want permanent", err)
	}
	for _, msg := range []string{"LOADING Redis is loading the dataset in memory", "CLUSTERDOWN The cluster is down"} {
		if redisPermanent(redisErr(msg)) {
			t.Errorf("%s: permanent, want transient", msg)
		}
	}
	if redisPermanent(errRefused) {
		t.Error("connection refused: permanent")
	}
}

// redisErr is a Redis server error with msg, as go-redis returns them.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}
