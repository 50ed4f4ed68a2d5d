package meterledger_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func names(ps []meterledger.Partition) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// Daily partitions for [now - 36 d, now + 2 d]: made once however many
// processes ask at once, and again by nobody.
func TestEnsurePartitionsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	var all []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		l, err := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(pool)}) // a process each
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			made, err := l.EnsurePartitions(ctx, t0)
			mu.Lock()
			all, errs[i] = append(all, made...), err
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	l, _ := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(pool)})
	ps, err := l.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	if len(ps) != 39 || !slices.Equal(all, names(ps)) || ps[0].Name != "meter_events_p20261025" || ps[38].Name != "meter_events_p20261202" {
		t.Fatalf("made %d (%v), listed %d: %v", len(all), all, len(ps), names(ps))
	}
	if !ps[0].From.Equal(time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC)) || !ps[0].To.Equal(ps[1].From) {
		t.Fatalf("bounds %v", ps[0])
	}
	if made, err := l.EnsurePartitions(ctx, t0); err != nil || len(made) != 0 {
		t.Fatalf("again: %v %v", made, err)
	}
	if made, err := l.EnsurePartitions(ctx, t0.Add(24*time.Hour)); err != nil || !slices.Equal(made, []string{"meter_events_p20261203"}) {
		t.Fatalf("a day later: %v %v", made, err)
	}
}

// Prune drops the days that ended more than 36 days ago (with their rows:
// events Stripe would refuse anyway), nothing newer, nothing not its own.
func TestPruneDropsOnlyOldPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	oct27 := mev("cus_1", "api_requests", 1, time.Date(2026, 10, 27, 13, 0, 0, 0, time.UTC))
	oct28 := mev("cus_2", "api_requests", 1, time.Date(2026, 10, 28, 13, 0, 0, 0, time.UTC))
	for _, c := range b.reserve(t, req(oct27, "A"), req(oct28, "A")) {
		if c.Decision != meterledger.Acquired {
			t.Fatalf("%v", c.Decision)
		}
		b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE meter_events_archive PARTITION OF meter_events
		FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-01-02 00:00+00')`); err != nil {
		t.Fatal(err)
	}
	if dropped, err := b.l.Prune(ctx, t0); err != nil || len(dropped) != 0 {
		t.Fatalf("nothing is old yet: %v %v", dropped, err)
	}
	now := t0.Add(72 * time.Hour) // 2026-12-03 12:00: the cut is 2026-10-28 12:00
	dropped, err := b.l.Prune(ctx, now)
	if want := []string{"meter_events_p20261025", "meter_events_p20261026", "meter_events_p20261027"}; err != nil || !slices.Equal(dropped, want) {
		t.Fatalf("dropped %v %v, want %v", dropped, err, want)
	}
	if _, err := b.l.Get(ctx, meterledger.KeyOf(oct27, req(oct27, "A").Identifier)); !errors.Is(err, meterledger.ErrNotFound) {
		t.Fatalf("the pruned day's row: %v", err)
	}
	if got, err := b.l.Get(ctx, meterledger.KeyOf(oct28, req(oct28, "A").Identifier)); err != nil || got.Status != meterledger.StatusDelivered {
		t.Fatalf("the kept day's row: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_class WHERE relname = 'meter_events_archive'`); n != 1 {
		t.Fatal("Prune dropped a table that is not one of its partitions")
	}
	if again, err := b.l.Prune(ctx, now); err != nil || len(again) != 0 {
		t.Fatalf("again: %v %v", again, err)
	}
	// The pruned event comes back: Stripe would refuse it, so is it.
	b.clk.Set(now)
	if c := b.one(t, req(oct27, "B")); c.Decision != meterledger.OutsideWindow {
		t.Fatalf("a pruned event redelivered: %v", c.Decision)
	}
}

// Every event Stripe takes has a partition: Reserve makes the partitions
// itself when its process has not, or when one went missing. A row no
// partition takes cannot be written.
func TestEveryValidEventHasAPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	fresh, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `DROP TABLE meter_events_p20261130, meter_events_p20261027`); err != nil {
		t.Fatal(err)
	}
	edges := []time.Time{t0.Add(-35 * 24 * time.Hour), t0.Add(-34 * 24 * time.Hour), t0, t0.Add(5 * time.Minute)}
	reserveAll := func(l *meterledger.Ledger, prefix string) {
		t.Helper()
		var reqs []meterledger.Request
		for _, ts := range edges {
			reqs = append(reqs, req(mev(prefix+ts.Format("0102150405"), "api_requests", 1, ts), "A"))
		}
		cs, err := l.Reserve(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range cs {
			if c.Decision != meterledger.Acquired {
				t.Fatalf("event at %s: %v", edges[i], c.Decision)
			}
		}
	}
	reserveAll(fresh, "cus_f") // a process that never ran EnsurePartitions
	// b.l ran it: it believes in a day that was dropped since.
	if _, err := b.pool.Exec(ctx, `DROP TABLE meter_events_p20261027`); err != nil {
		t.Fatal(err)
	}
	reserveAll(b.l, "cus_b")
	_, err = b.pool.Exec(ctx, `INSERT INTO meter_events (event_ts, identifier, event_name, stripe_customer_id, value, first_sent_at, epoch, created_at)
		VALUES ($1, 'pg_x', 'api_requests', 'cus_1', 1, now(), 1, now())`, t0.Add(4*24*time.Hour))
	if err == nil {
		t.Fatal("a row outside every partition was written")
	}
}
