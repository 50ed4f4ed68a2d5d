package meterledger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// Widths that divide an hour are allowed; every bucket they make lies
// inside one UTC hour (one window of the usage reconciliation), starts at
// or before each of its events and ends after it.
func TestAggregateBucketWidths(t *testing.T) {
	t.Parallel()
	for _, w := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second,
		30 * time.Second, time.Minute, 90 * time.Second, 5 * time.Minute, 15 * time.Minute, 20 * time.Minute, time.Hour} {
		if err := meterledger.CheckBucket(w); err != nil {
			t.Errorf("%s refused: %v", w, err)
		}
		for _, ts := range []time.Time{t0, t0.Add(-time.Second), t0.Add(-time.Nanosecond), t0.Add(59*time.Minute + 59*time.Second + 999*time.Millisecond),
			t0.Add(17*time.Minute + 31*time.Second + 5*time.Millisecond), time.Unix(1, 0), time.Unix(-61, 0)} {
			s := meterledger.BucketStart(ts, w)
			if s.After(ts) || !ts.Before(s.Add(w)) || s.Unix()%int64(w/time.Second) != 0 || s.Nanosecond() != 0 ||
				!s.Truncate(time.Hour).Equal(ts.Truncate(time.Hour)) {
				t.Errorf("bucket of %s at width %s starts %s: want an aligned start at or before it, in its UTC hour", ts, w, s)
			}
		}
	}
	for _, w := range []time.Duration{0, -time.Second, time.Millisecond, 1500 * time.Millisecond, 7 * time.Second,
		11 * time.Second, 7 * time.Minute, 2 * time.Hour, 24 * time.Hour} {
		if err := meterledger.CheckBucket(w); err == nil {
			t.Errorf("%s allowed: its buckets would straddle an hour or a second", w)
		}
	}
	b := setup(t)
	if _, _, _, err := b.l.FormAggregate(context.Background(), "test", "usage", "tokens", "cus_x", t0, 7*time.Second, "c",
		time.Minute); err == nil {
		t.Fatal("FormAggregate took a 7s bucket")
	}
}

// formAll forms and delivers every aggregate of cust ready at watermark
// with width, in the order formed.
func (b bundle) formAll(t *testing.T, cust string, watermark time.Time, width time.Duration) []meterledger.Aggregate {
	t.Helper()
	ctx := context.Background()
	var out []meterledger.Aggregate
	for {
		a, _, ok, err := b.l.FormAggregate(ctx, "test", "usage", "tokens", cust, watermark, width, "c", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		if res, err := b.l.FinishAggregate(ctx, a, meterledger.Delivered, ""); err != nil || res != meterledger.Delivered {
			t.Fatalf("finishing %s: %v %v", a.Identifier, res, err)
		}
		out = append(out, a)
	}
}

func entry(sec int64, ms, seq int) string { return fmt.Sprintf("%d-%d", sec*1000+int64(ms), seq) }

func idsOf(reqs ...int) func(all []string) []string {
	return func(all []string) []string {
		var out []string
		for _, i := range reqs {
			out = append(out, all[i])
		}
		return out
	}
}

// A minute's bucket: the events of one minute whose entries arrived in one
// minute form one aggregate, sent at the minute's start with their sum,
// only once the watermark passed the arrival minute's end; an event of
// that minute that arrived in the next forms another (its own arrival
// bucket, not a late join). After a rollback of both stores the same
// entries form the same aggregates under the same identifiers.
func TestAggregateOfAMinuteBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := t0.Add(-10 * time.Minute)
	M := m.Unix()
	reqs := []meterledger.IngestRequest{
		ingestReq(mev("cus_m", "tokens", 2, m.Add(time.Second)), entry(M+1, 400, 0)),
		ingestReq(mev("cus_m", "tokens", 3, m.Add(20*time.Second+500*time.Millisecond)), entry(M+21, 0, 0)),
		ingestReq(mev("cus_m", "tokens", 5, m.Add(59*time.Second+999*time.Millisecond)), entry(M+59, 999, 3)),
		ingestReq(mev("cus_m", "tokens", 7, m.Add(40*time.Second)), entry(M+65, 0, 0)),           // arrived in the next minute
		ingestReq(mev("cus_m", "tokens", 11, m.Add(time.Minute+time.Second)), entry(M+61, 0, 0)), // the next minute
	}
	var ids []string
	for _, r := range reqs {
		ids = append(ids, r.Identifier)
	}
	b.ingest(t, reqs...)
	if got := b.formAll(t, "cus_m", time.Unix(M+59, 999e6), time.Minute); len(got) != 0 {
		t.Fatalf("formed %d aggregates before the watermark passed the arrival minute's end", len(got))
	}
	first := b.formAll(t, "cus_m", time.Unix(M+60, 0), time.Minute)
	want := meterledger.AggregateIdentifier("test", "tokens", "cus_m", m, idsOf(0, 1, 2)(ids))
	if len(first) != 1 || first[0].Value != 10 || first[0].Members != 3 || !first[0].Second.Equal(m) || first[0].Bucket != time.Minute ||
		first[0].ArrivalSecond != M || first[0].LateJoin || first[0].Identifier != want {
		t.Fatalf("the minute's first bucket: %+v; want one aggregate %s of 10 (3 events) at %s, bucket 1m, arrival %d", first, want, m, M)
	}
	rest := b.formAll(t, "cus_m", time.Unix(M+120, 0), time.Minute)
	if len(rest) != 2 {
		t.Fatalf("formed %d aggregates once the next minute ended, want the late arrival's and the next minute's", len(rest))
	}
	slices.SortFunc(rest, func(x, y meterledger.Aggregate) int { return x.Second.Compare(y.Second) })
	if rest[0].Value != 7 || !rest[0].Second.Equal(m) || rest[0].ArrivalSecond != M+60 || rest[0].LateJoin ||
		rest[1].Value != 11 || !rest[1].Second.Equal(m.Add(time.Minute)) || rest[1].ArrivalSecond != M+60 {
		t.Fatalf("after the next minute: %+v; want 7 at %s (arrival %d) and 11 at %s", rest, m, M+60, m.Add(time.Minute))
	}

	// A rollback of both stores: the same entries, in another order, form
	// the same aggregates.
	for _, q := range []string{`DELETE FROM meter_aggregates`, `DELETE FROM meter_events`, `DELETE FROM meter_usage`} {
		if _, err := b.pool.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{4, 2, 3, 0, 1} {
		b.ingest(t, reqs[i])
	}
	again := b.formAll(t, "cus_m", time.Unix(M+120, 0), time.Minute)
	before := map[string]int64{first[0].Identifier: 10, rest[0].Identifier: 7, rest[1].Identifier: 11}
	if len(again) != 3 {
		t.Fatalf("formed %d aggregates again, want 3", len(again))
	}
	for _, a := range again {
		if v, ok := before[a.Identifier]; !ok || v != a.Value {
			t.Fatalf("formed again as %s (%d): not one of %v", a.Identifier, a.Value, before)
		}
	}
}

// The width changes between runs (1s, then 1m, then 1s again): aggregates
// formed before keep their identifiers, values and members; the next run
// groups only the events still queued, by its width; every event ends a
// member of exactly one aggregate; and a width's late-join count ignores
// the other widths' aggregates.
func TestAggregateWidthChangedBetweenRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := t0.Add(-20 * time.Minute)
	M := m.Unix()
	reqs := []meterledger.IngestRequest{
		ingestReq(mev("cus_w", "tokens", 1, m), entry(M, 100, 0)),                                     // 0: 1s run
		ingestReq(mev("cus_w", "tokens", 2, m.Add(time.Second)), entry(M+1, 0, 0)),                    // 1: 1s run
		ingestReq(mev("cus_w", "tokens", 4, m.Add(time.Second+time.Millisecond)), entry(M+1, 500, 0)), // 2: 1s run
		ingestReq(mev("cus_w", "tokens", 8, m.Add(30*time.Second)), entry(M+30, 0, 0)),                // 3: 1m run
		ingestReq(mev("cus_w", "tokens", 16, m.Add(45*time.Second)), entry(M+46, 0, 0)),               // 4: 1m run
		ingestReq(mev("cus_w", "tokens", 32, m), entry(M, 200, 0)),                                    // 5: queued after the 1s run
		ingestReq(mev("cus_w", "tokens", 64, m.Add(61*time.Second)), entry(M+61, 0, 0)),               // 6: 1s again
		ingestReq(mev("cus_w", "tokens", 128, m.Add(125*time.Second)), entry(M+125, 0, 0)),            // 7: 1m again
		ingestReq(mev("cus_w", "tokens", 256, m.Add(130*time.Second)), entry(M+130, 0, 0)),            // 8: 1m again
	}
	var ids []string
	for _, r := range reqs {
		ids = append(ids, r.Identifier)
	}
	b.ingest(t, reqs[:5]...)
	run1 := b.formAll(t, "cus_w", time.Unix(M+2, 0), time.Second)
	if len(run1) != 2 || run1[0].Value != 1 || run1[1].Value != 6 || run1[1].Members != 2 || run1[1].Bucket != time.Second {
		t.Fatalf("1s run: %+v; want 1 at %d and 6 (2 events) at %d", run1, M, M+1)
	}
	// Restarted with 1m: the minute's bucket (second M, arrival M) holds
	// the queued events only, with a 1s aggregate of that same second and
	// arrival already formed: not a late join of it.
	b.ingest(t, reqs[5])
	run2 := b.formAll(t, "cus_w", time.Unix(M+60, 0), time.Minute)
	want := meterledger.AggregateIdentifier("test", "tokens", "cus_w", m, idsOf(3, 4, 5)(ids))
	if len(run2) != 1 || run2[0].Value != 56 || run2[0].Members != 3 || !run2[0].Second.Equal(m) || run2[0].LateJoin ||
		run2[0].Identifier != want {
		t.Fatalf("1m run: %+v; want one aggregate %s of 56 (3 events) at %s, not a late join", run2, want, m)
	}
	// Back to 1s, then 1m again.
	b.ingest(t, reqs[6], reqs[7], reqs[8])
	run3 := b.formAll(t, "cus_w", time.Unix(M+62, 0), time.Second)
	run4 := b.formAll(t, "cus_w", time.Unix(M+180, 0), time.Minute)
	if len(run3) != 1 || run3[0].Value != 64 || !run3[0].Second.Equal(m.Add(61*time.Second)) ||
		len(run4) != 1 || run4[0].Value != 384 || !run4[0].Second.Equal(m.Add(2*time.Minute)) {
		t.Fatalf("1s again: %+v; 1m again: %+v", run3, run4)
	}

	// Every aggregate as formed, every event in exactly one.
	formed := slices.Concat(run1, run2, run3, run4)
	members := map[string]string{}
	for _, a := range formed {
		rows, err := b.l.Members(ctx, a.Identifier)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, r := range rows {
			if prev, ok := members[r.Identifier]; ok {
				t.Fatalf("event %s is a member of %s and %s", r.Identifier, prev, a.Identifier)
			}
			members[r.Identifier], sum = a.Identifier, sum+r.Value
		}
		var value int64
		var second time.Time
		var width int
		if err := b.pool.QueryRow(ctx, `SELECT value, second, bucket_seconds FROM meter_aggregates WHERE identifier = $1`,
			a.Identifier).Scan(&value, &second, &width); err != nil {
			t.Fatalf("aggregate %s: %v", a.Identifier, err)
		}
		if len(rows) != a.Members || sum != a.Value || value != a.Value || !second.Equal(a.Second) || time.Duration(width)*time.Second != a.Bucket {
			t.Fatalf("aggregate %s changed: %d members of %d, value %d/%d, second %s, width %ds; formed %+v", a.Identifier, len(rows),
				sum, value, a.Value, second, width, a)
		}
	}
	if len(members) != len(reqs) {
		t.Fatalf("%d of %d events are members of an aggregate", len(members), len(reqs))
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM meter_events WHERE status <> 'delivered' OR aggregate IS NULL`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events not delivered in an aggregate (%v)", n, err)
	}
}
