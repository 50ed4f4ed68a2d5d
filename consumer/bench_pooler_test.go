package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// BenchmarkConsumerPooler is BenchmarkConsumer's pelguard case over three
// connections to the same Postgres, in one run:
//   - direct/cache_statement: straight to Postgres in pgx's own default
//     mode (pelguard's mode before it chose one);
//   - direct/cache_describe: straight to Postgres in pelguard's mode
//     (pg.DefaultQueryExecMode);
//   - direct/exec: straight to Postgres in exec mode (the other
//     pooler-safe mode, not chosen: parameters typed by their Go type);
//   - pgbouncer/cache_describe: through PgBouncer in transaction mode.
//
// Run: go test -run '^$' -bench BenchmarkConsumerPooler -benchtime 1x -count 5 ./consumer/
func BenchmarkConsumerPooler(b *testing.B) {
	bouncer := pgbouncer.Start(b, pgbouncer.Config{PoolSize: 20})
	for _, c := range []struct {
		name string
		url  func(w *bundle) string
	}{
		{"direct/cache_statement", func(w *bundle) string { return w.dbURL + "&default_query_exec_mode=cache_statement" }},
		{"direct/cache_describe", func(w *bundle) string { return w.dbURL }},
		{"direct/exec", func(w *bundle) string { return w.dbURL + "&default_query_exec_mode=exec" }},
		{"pgbouncer/cache_describe", func(*bundle) string { return bouncer.URL("") }},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := benchEvents * b.N
			w := setupBench(b)
			w.seed(b, n)
			cfg, err := pgxpool.ParseConfig(c.url(w))
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns = 20
			pool, err := pg.OpenConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			ccfg := w.config(b, "")
			ccfg.DB = pool
			ccfg.Workers = 8
			ccfg.Count = 50
			ccfg.Logger = testenv.Discard()
			mon, err := rollback.New(rollback.Config{Schema: testenv.SchemaOf(w.pool), Writer: "consumer/bench", Redis: w.rdb, Logger: testenv.Discard()})
			if err != nil {
				b.Fatal(err)
			}
			if err := mon.Start(context.Background(), pool); err != nil {
				b.Fatal(err)
			}
			defer mon.Close()
			ccfg.Witness = mon
			cons, err := consumer.New(ccfg)
			if err != nil {
				b.Fatal(err)
			}
			pooled := strings.HasPrefix(c.name, "pgbouncer/")
			var before pgbouncer.Stats
			if pooled {
				before = bouncer.Stats(b, cfg.ConnConfig.Database)
			}
			b.ResetTimer()
			start := time.Now()
			if err := cons.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			w.waitCharged(b, n)
			elapsed := time.Since(start)
			b.StopTimer()
			_ = cons.Stop(context.Background())
			b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
			if pooled {
				// What crossed the pooler per event: each statement is a
				// round trip client → PgBouncer → Postgres and back.
				after := bouncer.Stats(b, cfg.ConnConfig.Database)
				b.ReportMetric(float64(after.Queries-before.Queries)/float64(n), "stmts/event")
				b.ReportMetric(float64(after.Xacts-before.Xacts)/float64(n), "xacts/event")
			}
		})
	}
}
