package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/pg"
)

// Snapshot is what a database holds in the given schemas: the schemas that
// exist, every relation with its kind and columns, and the rows of every
// ordinary table, as text. Two equal snapshots mean nothing there was
// created, altered, dropped or written.
func Snapshot(t testing.TB, pool *pgxpool.Pool, schemas ...string) string {
	t.Helper()
	ctx := context.Background()
	collect := func(q string, args ...any) []string {
		t.Helper()
		rows, err := pool.Query(ctx, q, args...)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	nsp := collect(`SELECT nspname::text FROM pg_namespace WHERE nspname = ANY($1) ORDER BY 1`, schemas)
	rels := collect(`
		SELECT n.nspname || '.' || c.relname || ':' || c.relkind::text || ':' ||
			coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ',' ORDER BY a.attnum)
				FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = ANY($1) ORDER BY 1`, schemas)
	var b strings.Builder
	fmt.Fprintf(&b, "schemas: %s\n", strings.Join(nsp, ","))
	for _, r := range rels {
		b.WriteString(r + "\n")
		name, kind, _ := strings.Cut(r, ":")
		if !strings.HasPrefix(kind, "r:") {
			continue
		}
		schema, table, _ := strings.Cut(name, ".")
		var s *string
		q := `SELECT string_agg(r::text, E'\n' ORDER BY r::text) FROM ` + pgx.Identifier{schema, table}.Sanitize() + ` r`
		if err := pool.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s != nil {
			b.WriteString(*s + "\n")
		}
	}
	return b.String()
}

// FreshDatabase creates a database of the test's own (dropped when it ends)
// and returns a pool and a URL for it, with no search_path: its public
// schema is the test's alone, as a team's database would be.
func FreshDatabase(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pg.Open(ctx, DatabaseURL(), 2)
	if err != nil {
		t.Fatalf("Postgres is not reachable (run the tests with `make test`): %v", err)
	}
	name := "t_db_" + Suffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		t.Fatalf("creating database: %v", err)
	}
	u, err := url.Parse(DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	pool, err := pg.Open(ctx, u.String(), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close()
	})
	return pool, u.String()
}
