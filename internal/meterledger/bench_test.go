package meterledger_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// countingConn counts the client's writes to Postgres: with statements
// cached (pgx's default), each is one round trip.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// benchLedger is a ledger over a migrated schema whose pool counts round
// trips, with `rows` delivered events already in today's partition.
func benchLedger(b *testing.B, rows int) (*meterledger.Ledger, *pgxpool.Pool, *atomic.Int64, *clock.Sim) {
	b.Helper()
	ctx := context.Background()
	pool, url := testenv.DBWithURL(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	writes := &atomic.Int64{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	cfg.MaxConns = 4
	counted, err := pg.OpenConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(counted.Close)
	clk := clock.NewSim(t0)
	l, err := meterledger.New(counted, meterledger.Config{Schema: testenv.SchemaOf(pool), Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.EnsurePartitions(ctx, t0); err != nil {
		b.Fatal(err)
	}
	if rows > 0 {
		if _, err := pool.Exec(ctx, `INSERT INTO meter_events (event_ts, identifier, event_name, stripe_customer_id,
				customer_id, value, status, first_sent_at, attempts, epoch, delivered_at, stream_message_id, created_at)
			SELECT $1::timestamptz - (g % 43200000) * interval '1 millisecond', 'pg_' || left(md5(g::text) || md5((-g)::text), 48),
				'api_requests', 'cus_' || (g % 2000), 'c_' || (g % 2000), 1 + g % 7, 'delivered', $1, 1, 1, $1,
				'1764500000000-' || g, $1
			FROM generate_series(1, $2::int) g`, t0, rows); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE meter_events_p20261130`); err != nil {
			b.Fatal(err)
		}
	}
	return l, pool, writes, clk
}

// benchRows is the size of the full table BenchmarkReserveFinish compares
// with an empty one: PELGUARD_BENCH_METER_ROWS, else 1,000,000 (the issue's
// 10,000,000 takes about ten times as long to seed, per run).
func benchRows() int {
	if n, err := strconv.Atoi(os.Getenv("PELGUARD_BENCH_METER_ROWS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

// BenchmarkReserveFinish: a consumer's batch of 100 meter events (2,000
// customers, one meter) reserved and finished delivered, the ledger work
// of one XREADGROUP page. Reports events/s and Postgres round trips per
// batch, on an empty table and on one that holds a million delivered
// events already (benchRows); then the state each event leaves behind and the share
// of finishes that were HOT updates.
func BenchmarkReserveFinish(b *testing.B) {
	for _, rows := range []int{0, benchRows()} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			ctx := context.Background()
			l, pool, writes, clk := benchLedger(b, rows)
			seq := 0
			batch := func() {
				reqs := make([]meterledger.Request, 100)
				for i := range reqs {
					seq++
					ev := mev(fmt.Sprintf("cus_%d", seq%2000), "api_requests", int64(seq%5+1), clk.Now().Add(-time.Duration(seq%3600)*time.Second))
					ev.EventID = fmt.Sprintf("req-%d", seq)
					reqs[i] = req(ev, "bench")
				}
				cs, err := l.Reserve(ctx, reqs)
				if err != nil {
					b.Fatal(err)
				}
				outs := make([]meterledger.Outcome, 0, len(cs))
				for _, c := range cs {
					if c.Decision.MaySend() {
						outs = append(outs, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
					}
				}
				if len(outs) < 90 {
					b.Fatalf("only %d of 100 sendable", len(outs))
				}
				if _, err := l.Finish(ctx, outs); err != nil {
					b.Fatal(err)
				}
			}
			batch() // prepares the statements on a connection
			writes.Store(0)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				batch()
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N*100)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(writes.Load())/float64(b.N), "roundtrips/batch")
			reportState(b, pool, ctx)
		})
	}
}

// reportState reports what each event costs at rest: the partitions'
// heap, indexes and TOAST per row, the average row as stored, and the
// share of updates that were HOT.
func reportState(b *testing.B, pool *pgxpool.Pool, ctx context.Context) {
	b.Helper()
	var n, total, heap int64
	var avgRow float64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(avg(pg_column_size(m.*)), 0) FROM meter_events m`).Scan(&n, &avgRow); err != nil {
		b.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0), coalesce(sum(pg_relation_size(i.inhrelid)), 0)
		FROM pg_inherits i WHERE i.inhparent = 'meter_events'::regclass`).Scan(&total, &heap); err != nil {
		b.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // backends flush their table statistics about once a second
	var upd, hot int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables
		WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'meter_events'::regclass)`).Scan(&upd, &hot); err != nil {
		b.Fatal(err)
	}
	if n > 0 {
		b.ReportMetric(float64(total)/float64(n), "state-bytes/event")
		b.ReportMetric(float64(heap)/float64(n), "heap-bytes/event")
		b.ReportMetric(avgRow, "row-bytes")
	}
	if upd > 0 {
		b.ReportMetric(100*float64(hot)/float64(upd), "hot-%")
	}
}

// BenchmarkPrune: dropping a day's partition that holds a million events
// (the days before it dropped first, untimed).
func BenchmarkPrune(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		l, _, _, _ := benchLedger(b, 1_000_000)
		nov30 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
		if _, err := l.Prune(ctx, nov30.Add(meterledger.Retention)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		dropped, err := l.Prune(ctx, nov30.AddDate(0, 0, 1).Add(meterledger.Retention))
		if err != nil || len(dropped) != 1 || dropped[0] != "meter_events_p20261130" {
			b.Fatalf("%v %v", dropped, err)
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "ms/prune")
	}
}
