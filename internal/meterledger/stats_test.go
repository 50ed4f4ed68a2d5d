package meterledger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A day's partition filled by ingest is analyzed by FreshenStats once
// enough of its rows changed, and then left alone; partitions before the
// sender's floor are never touched.
func TestFreshenStatsAnalyzesAFilledPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	day := t0.Add(-time.Hour)
	part := "meter_events_p" + day.Format("20060102")
	// Autovacuum's own analyze would race the test's: off for this table.
	if _, err := b.pool.Exec(ctx, `ALTER TABLE `+testenv.SchemaOf(b.pool)+`.`+part+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	for batch := range 3 {
		var reqs []meterledger.IngestRequest
		for i := range 1000 {
			ev := mev(fmt.Sprintf("cus_%d", i%50), "tokens", 1, day.Add(time.Duration(batch*1000+i)*time.Millisecond))
			reqs = append(reqs, ingestReq(ev, fmt.Sprintf("%d-%d", day.UnixMilli(), batch*1000+i)))
		}
		b.ingest(t, reqs...)
	}
	reltuples := func() float64 {
		var n float64
		if err := b.pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)`,
			testenv.SchemaOf(b.pool)+"."+part).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := reltuples(); n > 0 {
		t.Fatalf("%s has reltuples %v before any analyze: the test would prove nothing", part, n)
	}
	// The counters of changed rows reach Postgres's statistics within a
	// second or so of the commits: until then nothing is stale.
	var analyzed []string
	testenv.Eventually(t, 15*time.Second, func() bool {
		// From the next day on: this day's partition is below the floor.
		later, err := b.l.FreshenStats(ctx, day.Add(24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(later) > 0 {
			t.Fatalf("analyzed %v, all after the floor's day and empty", later)
		}
		analyzed, err = b.l.FreshenStats(ctx, day)
		if err != nil {
			t.Fatal(err)
		}
		return len(analyzed) > 0
	}, "the filled partition %s was never analyzed", part)
	if !slices.Equal(analyzed, []string{part}) {
		t.Fatalf("analyzed %v, want only %s (the other days are empty)", analyzed, part)
	}
	if n := reltuples(); n < 3000 {
		t.Fatalf("%s has reltuples %v after the analyze, want its 3000 rows", part, n)
	}
	// At the sender's small target: a histogram of at most 21 bounds
	// (Postgres's default would give 101 for 3,000 distinct timestamps).
	var bounds int
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(array_length(histogram_bounds::text::text[], 1), 0) FROM pg_stats
		WHERE schemaname = $1 AND tablename = $2 AND attname = 'event_ts'`, testenv.SchemaOf(b.pool), part).Scan(&bounds); err != nil {
		t.Fatal(err)
	}
	if bounds < 2 || bounds > 21 {
		t.Fatalf("%s's event_ts histogram has %d bounds, want 2-21 (analyzed at a statistics target of 20)", part, bounds)
	}
	again, err := b.l.FreshenStats(ctx, day)
	if err != nil || len(again) != 0 {
		t.Fatalf("analyzed again at once: %v, %v", again, err)
	}
}
