package meterledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Concurrent ingesters of one capped customer and meter, beside an
// uncapped one, each batch also redelivering an earlier one: every event
// is recorded once, the capped use stops exactly where the cap is (values
// 3 under a cap of 100: 33 events, 99 units, whatever the interleaving),
// and the use of each customer is the sum of its queued rows.
func TestIngestCapExactUnderConcurrentIngesters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.SetCap(ctx, meterledger.Cap{EventName: "tokens", StripeCustomerID: "cus_capped", Month: meterledger.AnyMonth, Cap: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.l.SetCap(ctx, meterledger.Cap{EventName: "calls", StripeCustomerID: "cus_capped", Month: meterledger.AnyMonth,
		Cap: 7, Counts: meterledger.CountEvents}); err != nil {
		t.Fatal(err)
	}
	const ingesters, batches, per = 6, 4, 10
	batch := func(g, j int) []meterledger.IngestRequest {
		var reqs []meterledger.IngestRequest
		for i := range per {
			ts := t0.Add(-time.Duration(g*1000+j*per+i) * time.Millisecond)
			reqs = append(reqs, ingestReq(mev("cus_capped", "tokens", 3, ts), fmt.Sprintf("%d-%d-%d", g, j, i)),
				ingestReq(mev("cus_free", "tokens", 2, ts), fmt.Sprintf("f%d-%d-%d", g, j, i)))
			if i%5 == 0 {
				reqs = append(reqs, ingestReq(mev("cus_capped", "calls", 1, ts), fmt.Sprintf("c%d-%d-%d", g, j, i)))
			}
		}
		return reqs
	}
	var mu sync.Mutex
	decided := map[string]meterledger.Decision{} // identifier: its first answer
	var wg sync.WaitGroup
	for g := range ingesters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range batches {
				reqs := batch(g, j)
				if j > 0 {
					reqs = append(reqs, batch(g, j-1)...) // a redelivery
				}
				if g > 0 {
					reqs = append(reqs, batch(g-1, j)...) // another ingester's batch at once
				}
				out, err := b.l.Ingest(ctx, reqs)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, o := range out {
					if _, ok := decided[reqs[i].Identifier]; !ok || o.Decision == meterledger.Queued {
						decided[reqs[i].Identifier] = o.Decision
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, d := range decided {
		if d != meterledger.Queued && d != meterledger.OverCap && d != meterledger.InLedger {
			t.Fatalf("decision %v, want queued, in_ledger or over_cap", d)
		}
	}
	var rows []struct {
		sc, name      string
		units, events int64
	}
	r, err := b.pool.Query(ctx, `SELECT stripe_customer_id, event_name, sum(value), count(*) FROM meter_events GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var x struct {
			sc, name      string
			units, events int64
		}
		if err := r.Scan(&x.sc, &x.name, &x.units, &x.events); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, x)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int64{"cus_capped/tokens": {99, 33}, "cus_capped/calls": {7, 7},
		"cus_free/tokens": {2 * ingesters * batches * per, ingesters * batches * per}}
	for _, x := range rows {
		w := want[x.sc+"/"+x.name]
		if x.units != w[0] || x.events != w[1] {
			t.Fatalf("%s/%s: %d units in %d rows, want %v", x.sc, x.name, x.units, x.events, w)
		}
		us, err := b.l.Usage(ctx, x.name, x.sc, t0)
		if err != nil || len(us) != 1 || us[0].Units != x.units || us[0].Events != x.events {
			t.Fatalf("%s/%s use %+v (%v), want the rows' %d units, %d events", x.sc, x.name, us, err, x.units, x.events)
		}
	}
	if len(rows) != 3 {
		t.Fatalf("rows of %d customer-meters, want 3", len(rows))
	}
}

// A cap's headroom used by another ingest between the one-statement
// path's read and its count: the statement writes nothing, and the batch
// is decided on the latest count (the first event fits, the others pass
// the cap and are refused).
func TestIngestCapUsedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.SetCap(ctx, meterledger.Cap{EventName: "tokens", StripeCustomerID: "cus_c", Month: meterledger.AnyMonth, Cap: 10}); err != nil {
		t.Fatal(err)
	}
	if out := b.ingest(t, ingestReq(mev("cus_c", "tokens", 1, t0.Add(-time.Minute)), "1-0")); out[0].Decision != meterledger.Queued {
		t.Fatalf("first event: %v", out[0].Decision)
	}
	// Another ingest holds the customer's use, and counts 5 more.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM meter_usage WHERE stripe_customer_id = 'cus_c' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	reqs := []meterledger.IngestRequest{}
	for i := range 3 {
		reqs = append(reqs, ingestReq(mev("cus_c", "tokens", 3, t0.Add(time.Duration(i-10)*time.Second)), fmt.Sprintf("2-%d", i)))
	}
	done := make(chan []meterledger.Ingested, 1)
	go func() {
		out, err := b.l.Ingest(ctx, reqs)
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	schema := testenv.SchemaOf(b.pool)
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%meter_usage%' AND strpos(query, $1) > 0`, schema).Scan(&n)
		return err == nil && n > 0
	}, "the ingest waits for the customer's use")
	if _, err := tx.Exec(ctx, `UPDATE meter_usage SET units = units + 5, events = events + 1 WHERE stripe_customer_id = 'cus_c'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if len(out) != 3 || out[0].Decision != meterledger.Queued || out[1].Decision != meterledger.OverCap || out[2].Decision != meterledger.OverCap {
		t.Fatalf("decisions %v, want queued then two over_cap", out)
	}
	us, err := b.l.Usage(ctx, "tokens", "cus_c", t0)
	if err != nil || len(us) != 1 || us[0].Units != 9 || us[0].Events != 3 {
		t.Fatalf("use %+v (%v), want 9 units in 3 events", us, err)
	}
	var rows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM meter_events WHERE stripe_customer_id = 'cus_c'`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("%d rows (%v), want the first event's and one of the batch", rows, err)
	}
}
