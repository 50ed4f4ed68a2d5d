package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// BenchmarkRoundTrip is one statement's round trip (SELECT 1 in pgx's
// cache_describe mode, one connection) straight to Postgres and through
// PgBouncer in transaction mode: what the pooler adds to each statement,
// to weigh against the statements per event BenchmarkConsumerPooler
// reports. Run: go test -run '^$' -bench BenchmarkRoundTrip ./internal/testkit/pgbouncer/
func BenchmarkRoundTrip(b *testing.B) {
	bouncer := pgbouncer.Start(b, pgbouncer.Config{PoolSize: 2})
	for _, c := range []struct{ name, url string }{
		{"direct", testenv.DatabaseURL()},
		{"pgbouncer", bouncer.URL("")},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg, err := pgx.ParseConfig(c.url)
			if err != nil {
				b.Fatal(err)
			}
			cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			conn, err := pgx.ConnectConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(context.Background())
			var one int
			b.ResetTimer()
			for range b.N {
				if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
