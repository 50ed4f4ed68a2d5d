package reaper_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/reaper"
)

// TestProducerMaxLenLossAlerted: consumers stopped (50 entries read and
// left pending by a dead consumer), a producer publishes 1,000 events with
// MAXLEN ~ 100. The reaper alerts once with the count of entries the group
// never read and their id range (worked out here from the ids the producer
// got back), counts them, records them for the console, and acks the 50
// pending entries whose bodies went with the trim, alerted too.
func TestProducerMaxLenLossAlerted(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	before := b.add(t, evs(50)...)
	read := b.read(t, deadName, 50)
	if len(read) != 50 {
		t.Fatalf("read %d", len(read))
	}
	ids := make([]string, 0, 1000)
	for i := range 1000 {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, MaxLen: 100, Approx: true,
			Values: map[string]any{"payload": ev(100 + i).Payload()}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	first, err := b.rdb.XRangeN(ctx, b.stream, "-", "+", 1).Result()
	if err != nil || len(first) != 1 {
		t.Fatalf("first entry: %v %v", first, err)
	}
	// Lost unread: the producer's ids below the first entry left.
	var want int64
	for _, id := range ids {
		if id == first[0].ID {
			break
		}
		want++
	}
	if want < 800 {
		t.Fatalf("MAXLEN ~ 100 left %d of 1,000 unread entries trimmed: the test needs a real loss", want)
	}

	reg := prometheus.NewRegistry()
	cfg := b.config(t, "reaper-loss")
	cfg.Metrics = reaper.NewMetrics(reg)
	b.waitIdle(t, 50, cfg.MinIdle)
	r := b.newReaper(t, cfg)
	for range 2 { // the second pass must not alert again
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lost := streamLossAlerts(b.notifier)
	if len(lost) != 2 {
		t.Fatalf("%d stream_entries_lost alerts, want 2 (unread, gone): %+v", len(lost), lost)
	}
	var unread, gone alerts.Alert
	for _, a := range lost {
		if strings.Contains(a.Title, "had no body") {
			gone = a
		} else {
			unread = a
		}
	}
	wantFields := map[string]string{"Stream": b.stream, "Group": b.group, "Entries": itoa(want),
		"Ids": "above " + before[49] + ", below " + first[0].ID, "Pending below the first entry": "50"}
	for _, f := range unread.Fields {
		if w, ok := wantFields[f.Label]; ok && f.Value != w {
			t.Errorf("unread alert %s = %q, want %q", f.Label, f.Value, w)
		}
		delete(wantFields, f.Label)
	}
	if len(wantFields) > 0 {
		t.Errorf("unread alert lacks %v: %+v", wantFields, unread)
	}
	if !strings.Contains(gone.Text, before[0]) || !strings.Contains(gone.Text, before[49]) || !strings.HasPrefix(gone.Title, "50 ") {
		t.Errorf("gone alert %q / %q: want 50 entries, ids %s to %s", gone.Title, gone.Text, before[0], before[49])
	}
	if got := cfg.Metrics.Lost(b.stream, b.group, "unread"); got != float64(want) {
		t.Errorf("lost unread metric %v, want %d", got, want)
	}
	if got := cfg.Metrics.Lost(b.stream, b.group, "gone"); got != 50 {
		t.Errorf("lost gone metric %v, want 50", got)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Errorf("%d pending entries left: the gone ones are acked", len(p))
	}
	recs, err := reaper.Losses(ctx, b.rdb, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d loss records for the console, want 2", len(recs))
	}
	if ttl := b.rdb.TTL(ctx, reaper.LossesKey(b.stream)).Val(); ttl <= 0 || ttl > 30*24*time.Hour {
		t.Errorf("the loss records' TTL %s: want them to expire within 30 days", ttl)
	}
	b.rdb.Del(ctx, reaper.LossesKey(b.stream))
}

// TestOwnTrimLosesNothing: the same 1,000 events without MAXLEN, consumers
// stopped for longer than the retention (the injected clock): the reaper's
// trim removes nothing unread, nothing is alerted, and the group then reads
// every event.
func TestOwnTrimLosesNothing(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ids := b.add(t, evs(1000)...)
	cfg := b.config(t, "reaper-no-loss")
	r := b.newReaper(t, cfg)
	b.clk.Advance(reaper.DefaultStreamRetention + time.Hour)
	for range 3 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(streamLossAlerts(b.notifier)); n != 0 {
		t.Fatalf("%d loss alerts", n)
	}
	got := b.read(t, "billing-1", 2000)
	if len(got) != len(ids) {
		t.Fatalf("the group read %d of %d events after the reaper's trims", len(got), len(ids))
	}
	for i, m := range got {
		if m.ID != ids[i] || len(m.Values) == 0 {
			t.Fatalf("entry %d: %s (body %v), want %s", i, m.ID, m.Values, ids[i])
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestGroupCreatedLateIsNotALoss: entries the reaper trimmed once
// pelguard's group had read and acked them and the retention had passed
// are no loss to a group created afterwards at 0 (another team's new
// group, or a group recreated after a Redis failover), although that group
// has an id gap under it and Redis reports a lag: it has read nothing, and
// Redis cannot tell it from a group that lost entries; the reaper never saw
// it whole, so it does not alert.
func TestGroupCreatedLateIsNotALoss(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.add(t, evs(500)...)
	readAck(t, b.rdb, b.stream, b.group, "billing-1", 1000, 1000)
	cfg := b.config(t, "reaper-late")
	cfg.MinIdle = time.Hour
	r := b.newReaper(t, cfg)
	b.clk.Advance(reaper.DefaultStreamRetention + time.Minute)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.rdb.XLen(ctx, b.stream).Val(); n >= 500 {
		t.Fatalf("XLEN %d: the trim this test needs did not happen", n)
	}
	if err := b.rdb.XGroupCreate(ctx, b.stream, otherGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if as := streamLossAlerts(b.notifier); len(as) != 0 {
		t.Fatalf("a group created after the trim was alerted as a loss: %+v", as)
	}
}

// TestMeterStreamsAreTrimmedAndWatched: a meter-event stream gets the
// same bounds: read and acked entries past the retention are trimmed, the
// pending ones kept, and a producer's MAXLEN under a stopped group alerted.
func TestMeterStreamsAreTrimmedAndWatched(t *testing.T) {
	b := meterSetup(t)
	ctx := context.Background()
	at := b.clk.Now()
	evs := make([]event.MeterEvent, 400)
	for i := range evs {
		evs[i] = usage(i%7, i, at)
	}
	b.addUsage(t, evs...)
	msgs := readAck(t, b.rdb, b.stream, b.group, "meter-1", 400, 300) // 100 left pending
	cfg := b.meterConfig(t)
	cfg.MinIdle = time.Hour
	r := b.newReaper(t, cfg)
	b.clk.Advance(reaper.DefaultStreamRetention + time.Minute)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.rdb.XLen(ctx, b.stream).Val(); n >= 400 || n < 100 {
		t.Fatalf("XLEN %d: want the acked entries trimmed and the 100 pending kept", n)
	}
	ids := make([]string, 0, 100)
	for _, m := range msgs[300:] {
		ids = append(ids, m.ID)
	}
	if gone := missing(t, b.rdb, b.stream, ids); len(gone) > 0 {
		t.Fatalf("%d pending meter events trimmed, first %s", len(gone), gone[0])
	}
	for i := range 500 {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, MaxLen: 50, Approx: true,
			Values: map[string]any{"payload": usage(1, 1000+i, b.clk.Now()).Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	lost := streamLossAlerts(b.notifier)
	if len(lost) != 1 || !strings.Contains(lost[0].Title, b.stream) {
		t.Fatalf("alerts %+v: want one loss on the meter stream", lost)
	}
}
