package meterledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// volume is the stream of the usage-at-volume scenario: one busy customer
// at 5,000 events/s beside 10,000 quiet customers at 0.05 events/s each
// (500/s between them), one sum meter, in stream order: of every 11
// entries 10 are the busy customer's and 1 a quiet one's, the quiet ones
// taken in turn; event k's timestamp is k/5,500 s after the start (60 s
// of production is 330,000 events).
type volume struct{ start time.Time }

const (
	volumeRate  = 5500
	volumeQuiet = 10000
)

func (v volume) event(k int64) event.MeterEvent {
	cus := "cus_busy"
	if k%11 == 10 {
		cus = fmt.Sprintf("cus_q%d", (k/11)%volumeQuiet)
	}
	ev := mev(cus, "api_requests", k%5+1, v.start.Add(time.Duration(k)*time.Second/volumeRate))
	ev.EventID = fmt.Sprintf("req-%d", k)
	return ev
}

// volumeLedger is a ledger over a migrated schema with a pool of conns
// connections, and a spend cap on every customer of the meter ('*',
// never reached: every event is counted against it).
func volumeLedger(b *testing.B, conns int32) (*meterledger.Ledger, *pgxpool.Pool, *clock.Sim) {
	b.Helper()
	ctx := context.Background()
	admin, url := testenv.DBWithURL(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = conns, conns
	pool, err := pg.OpenConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	clk := clock.NewSim(t0)
	l, err := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(admin), Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.EnsurePartitions(ctx, t0); err != nil {
		b.Fatal(err)
	}
	if _, err := l.SetCap(ctx, meterledger.Cap{EventName: "api_requests", StripeCustomerID: meterledger.AnyCustomer,
		Month: meterledger.AnyMonth, Cap: 1 << 50}); err != nil {
		b.Fatal(err)
	}
	return l, admin, clk
}

// BenchmarkIngestAtVolume: the usage-at-volume stream (volume) ingested
// as a backlog by `ingesters` consumers' batches at once, each a stream
// read of `batch` entries in stream order, over a pool of as many
// Postgres connections (so at most 16), spend caps on. "ingest" records
// each event queued and counted against its cap (Ingest: what
// --send-from-ledger does before the ack); events/s is what the ledger
// takes. "per-event" reserves and finishes the same batches as a
// per-event consumer does, where one event per customer-meter may be in
// flight, so most of the busy customer's events stay pending (sendable/s
// counts what it could act on). Compare with BenchmarkReserveFinish from
// the same run.
func BenchmarkIngestAtVolume(b *testing.B) {
	for _, c := range []struct {
		mode             string
		batch, ingesters int
	}{{"ingest", 100, 4}, {"ingest", 500, 8}, {"ingest", 250, 16}, {"per-event", 100, 4}} {
		b.Run(fmt.Sprintf("%s/batch=%d/ingesters=%d", c.mode, c.batch, c.ingesters), func(b *testing.B) {
			ctx := context.Background()
			l, admin, clk := volumeLedger(b, int32(c.ingesters))
			v := volume{start: clk.Now().Add(-10 * time.Minute)}
			var next, done atomic.Int64
			var ingested atomic.Int64
			work := func(j int64) error {
				reqs := make([]meterledger.Request, c.batch)
				for i := range reqs {
					reqs[i] = req(v.event(j*int64(c.batch)+int64(i)), "bench")
				}
				if c.mode == "ingest" {
					in := make([]meterledger.IngestRequest, len(reqs))
					for i, r := range reqs {
						in[i] = meterledger.IngestRequest{Request: r, Stream: "usage", Fields: map[string]any{event.PayloadField: r.Event.Payload()}}
					}
					out, err := l.Ingest(ctx, in)
					if err != nil {
						return err
					}
					for _, g := range out {
						if g.Decision == meterledger.Queued {
							done.Add(1)
						}
					}
					ingested.Add(int64(len(out)))
					return nil
				}
				cs, err := l.Reserve(ctx, reqs)
				if err != nil {
					return err
				}
				var outs []meterledger.Outcome
				for _, c := range cs {
					if c.Decision.MaySend() {
						outs = append(outs, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
					}
				}
				if _, err := l.Finish(ctx, outs); err != nil {
					return err
				}
				done.Add(int64(len(outs)))
				return nil
			}
			// The first batch of each connection prepares its statements.
			var wg sync.WaitGroup
			for range c.ingesters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := work(next.Add(1) - 1); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			done.Store(0)
			first := next.Load()
			b.ResetTimer()
			start := time.Now()
			for range c.ingesters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						j := next.Add(1) - 1
						if j >= first+int64(b.N) {
							return
						}
						if err := work(j); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			events := float64(b.N * c.batch)
			if c.mode == "ingest" {
				b.ReportMetric(events/elapsed.Seconds(), "events/s")
				if done.Load() != int64(b.N*c.batch) {
					b.Fatalf("%d of %d events queued", done.Load(), b.N*c.batch)
				}
				// Every event once in the ledger, and counted once.
				var rows, units, used int64
				if err := admin.QueryRow(ctx, `SELECT count(*), coalesce(sum(value), 0) FROM meter_events`).Scan(&rows, &units); err != nil {
					b.Fatal(err)
				}
				if err := admin.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM meter_usage`).Scan(&used); err != nil {
					b.Fatal(err)
				}
				if rows != ingested.Load() || used != units {
					b.Fatalf("%d rows for %d events ingested, use %d for %d units", rows, ingested.Load(), used, units)
				}
			} else {
				b.ReportMetric(float64(done.Load())/elapsed.Seconds(), "sendable/s")
				b.ReportMetric(events/elapsed.Seconds(), "read/s")
			}
			b.ReportMetric(float64(c.ingesters), "conns")
		})
	}
}
