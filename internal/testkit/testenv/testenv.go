// Package testenv gives each test its own real Postgres schema (migrated) and
// its own Redis key names, so tests run in parallel against the real services
// that `make test` provides through REDIS_URL and DATABASE_URL.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/migrations"
)

// Default service addresses, used when the environment names none.
const (
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// RedisURL is REDIS_URL or the default.
func RedisURL() string { return envOr("REDIS_URL", DefaultRedisURL) }

// DatabaseURL is DATABASE_URL or the default.
func DatabaseURL() string { return envOr("DATABASE_URL", DefaultDatabaseURL) }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Suffix returns a short random hex string.
func Suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name returns a name unique to this test run: prefix, a sanitised test name
// and a random suffix. Use it for streams, groups and consumers.
func Name(t testing.TB, prefix string) string {
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return prefix + ":" + n + ":" + Suffix()
}

// Redis returns a client for REDIS_URL. Keys a test creates are its own to
// clean up (see CleanupKeys).
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("parsing REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s is not reachable (run the tests with `make test`, which starts one): %v", opt.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CleanupKeys deletes keys when the test ends.
func CleanupKeys(t testing.TB, c redis.UniversalClient, keys ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Del(ctx, keys...).Err()
	})
}

// DB returns a pool whose search_path is a fresh, migrated schema that is
// dropped when the test ends.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := DBWithURL(t)
	return pool
}

// DBWithURL is DB and also returns a connection URL that selects the same
// schema, for subprocesses (binaries under test).
func DBWithURL(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := DatabaseURL()
	admin, err := pg.Open(ctx, base, 2)
	if err != nil {
		t.Fatalf("Postgres is not reachable (run the tests with `make test`, which starts one): %v", err)
	}
	schema := "t_" + Suffix()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	url := withSearchPath(base, schema)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parsing DATABASE_URL: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pg.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(pool.Close)
	schemas.Store(pool, schema)
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("%v", err)
	}
	return pool, url
}

// BareDB is DBWithURL without migrations, for migration tests.
func BareDB(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pg.Open(ctx, DatabaseURL(), 2)
	if err != nil {
		t.Fatalf("Postgres is not reachable (run the tests with `make test`): %v", err)
	}
	schema := "t_" + Suffix()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	url := withSearchPath(DatabaseURL(), schema)
	pool, err := pg.Open(ctx, url, 10)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(pool.Close)
	schemas.Store(pool, schema)
	return pool, url
}

// schemas maps each pool DB and BareDB made to its test's schema.
var schemas sync.Map

// SchemaOf is the schema of a pool from DB, DBWithURL or BareDB: the value
// a test passes as Config.Schema (pelguard names its schema in every
// statement, so a test's search_path alone does not select it).
func SchemaOf(pool *pgxpool.Pool) string {
	s, ok := schemas.Load(pool)
	if !ok {
		panic("testenv.SchemaOf: not a pool of testenv's")
	}
	return s.(string)
}

// SchemaOfURL is the schema a URL from DBWithURL or BareDB selects.
func SchemaOfURL(url string) string {
	_, after, ok := strings.Cut(url, "search_path=")
	if !ok {
		panic("testenv.SchemaOfURL: not a URL of testenv's")
	}
	s, _, _ := strings.Cut(after, "&")
	return s
}

// withSearchPath adds search_path to a postgres URL (pgx passes unknown
// query parameters to the server as run-time parameters).
func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// Logger returns a slog.Logger that writes through t.Log, so output shows up
// only for failing tests. Set PELGUARD_TEST_LOG=1 to see it always (go test -v).
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	defer func() { _ = recover() }() // t.Log after the test ended panics; drop the line.
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Discard is a logger that drops everything (benchmarks).
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Eventually polls cond every 10 ms until it is true or timeout passes. It is
// for waiting on another process or a real server, never as a sleep.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", timeout, fmt.Sprintf(format, args...))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// InParallel runs fn total times from workers goroutines and reports the
// first error through t (benchmarks that need a fixed amount of work per op).
func InParallel(t testing.TB, total, workers int, fn func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				if err := fn(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// SyncBuffer collects what several goroutines (a process's stdout and
// stderr, a logger) write, safely.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Len is how many bytes were written.
func (s *SyncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// Reset empties the buffer.
func (s *SyncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}
