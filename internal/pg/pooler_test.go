package pg

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pelguard's pools use cache_describe unless the URL names a mode: pgx's
// default (cache_statement) breaks behind a transaction-mode pooler.
func TestPoolerSafeModeUnlessTheURLNamesOne(t *testing.T) {
	for _, c := range []struct {
		url  string
		want pgx.QueryExecMode
	}{
		{"postgres://u@h/db", pgx.QueryExecModeCacheDescribe},
		{"postgres://u@h/db?sslmode=disable", pgx.QueryExecModeCacheDescribe},
		{"postgres://u@h/db?default_query_exec_mode=exec", pgx.QueryExecModeExec},
		{"postgres://u@h/db?default_query_exec_mode=cache_statement", pgx.QueryExecModeCacheStatement},
		{"host=h user=u default_query_exec_mode=simple_protocol", pgx.QueryExecModeSimpleProtocol},
	} {
		cfg, err := pgxpool.ParseConfig(c.url)
		if err != nil {
			t.Fatal(err)
		}
		PoolerSafe(cfg)
		if got := cfg.ConnConfig.DefaultQueryExecMode; got != c.want {
			t.Errorf("%s: mode %v, want %v", c.url, got, c.want)
		}
	}
}

// The errors a pooler causes say so and name the fix; others pass as they are.
func TestPoolerHint(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&pgconn.PgError{Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`}, "default_query_exec_mode"},
		{&pgconn.PgError{Code: "26000", Message: `prepared statement "stmtcache_1" does not exist`}, "default_query_exec_mode"},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "unsupported startup parameter: search_path"}), "--db-schema"},
	} {
		got := PoolerHint(c.err)
		if !errors.Is(got, c.err) || !strings.Contains(got.Error(), "pooler") || !strings.Contains(got.Error(), c.want) {
			t.Errorf("%v: got %v, want it wrapped, naming the pooler and %s", c.err, got, c.want)
		}
	}
	other := &pgconn.PgError{Code: "23505", Message: "duplicate key"}
	if got := PoolerHint(other); got != error(other) {
		t.Errorf("an unrelated error was changed: %v", got)
	}
	if PoolerHint(nil) != nil {
		t.Error("nil became an error")
	}
}
