package reaper_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/reaper"
)

const otherGroup = "team-analytics" // another team's group on the same stream

// xaddAt adds n entries with ids from ms (one per millisecond), as a
// producer did that long ago; it returns their ids.
func xaddAt(t testing.TB, rdb *redis.Client, stream string, ms int64, n int) []string {
	t.Helper()
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, n)
	for i := range n {
		cmds[i] = pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("%d-0", ms+int64(i)),
			Values: map[string]any{"payload": ev(i).Payload()}})
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids
}

// readAck reads n entries for group as consumer and acks the first acks.
func readAck(t testing.TB, rdb *redis.Client, stream, group, name string, n, acks int64) []redis.XMessage {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: group, Consumer: name,
		Streams: []string{stream, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	msgs := res[0].Messages
	ids := make([]string, 0, acks)
	for _, m := range msgs[:min(int64(len(msgs)), acks)] {
		ids = append(ids, m.ID)
	}
	if len(ids) > 0 {
		if err := rdb.XAck(context.Background(), stream, group, ids...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return msgs
}

// missing lists the ids of want that the stream no longer holds.
func missing(t testing.TB, rdb *redis.Client, stream string, want []string) []string {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, want[0], "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	have := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		have[m.ID] = true
	}
	var out []string
	for _, id := range want {
		if !have[id] {
			out = append(out, id)
		}
	}
	return out
}

func usedMemory(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

func streamLossAlerts(n *alerts.Memory) []alerts.Alert {
	var out []alerts.Alert
	for _, a := range n.Alerts() {
		if a.Kind == alerts.KindStreamEntriesLost {
			out = append(out, a)
		}
	}
	return out
}

// TestTrimKeepsWhatEveryGroupNeeds: pelguard's group and another team's,
// each with entries read and pending, on a stream with entries older than
// the retention. The reaper's trim removes no entry either group still
// needs (the other group's lowest pending entry bounds it), also while
// producers add and consumers read during the passes; once both groups
// have read and acked everything, the stream shrinks to the retention.
func TestTrimKeepsWhatEveryGroupNeeds(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	if err := b.rdb.XGroupCreate(ctx, b.stream, otherGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	old := xaddAt(t, b.rdb, b.stream, b.clk.Now().Add(-8*24*time.Hour).UnixMilli(), 3000)
	fresh := b.add(t, evs(200)...)
	// pelguard's group: 1,600 read, 1,500 acked; the team's: 900 read, 600 acked.
	readAck(t, b.rdb, b.stream, b.group, "billing-1", 1600, 1500)
	readAck(t, b.rdb, b.stream, otherGroup, "team-1", 900, 600)
	lenBefore := b.rdb.XLen(ctx, b.stream).Val()
	memBefore, usedBefore := b.rdb.MemoryUsage(ctx, b.stream, 0).Val(), usedMemory(t, b.rdb)

	reg := prometheus.NewRegistry()
	cfg := b.config(t, "reaper-trim")
	cfg.MinIdle, cfg.Metrics = time.Hour, reaper.NewMetrics(reg) // this test is about trimming, not reaping
	r := b.newReaper(t, cfg)

	// Concurrent producers and a reader of pelguard's group while passes trim.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var added atomic.Int64
	var concurrent []string
	var mu sync.Mutex
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": ev(10_000 + i).Payload()}}).Result()
			if err != nil {
				t.Error(err)
				return
			}
			added.Add(1)
			mu.Lock()
			concurrent = append(concurrent, id)
			mu.Unlock()
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "billing-2",
				Streams: []string{b.stream, ">"}, Count: 50, Block: -1}).Result()
			if err != nil && err != redis.Nil {
				t.Error(err)
				return
			}
			for _, s := range res {
				for _, m := range s.Messages {
					if len(m.Values) == 0 {
						t.Errorf("entry %s delivered without a body: trimmed under a reader", m.ID)
					}
					b.rdb.XAck(ctx, b.stream, b.group, m.ID)
				}
			}
		}
	})
	for range 5 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()

	// The team's lowest pending entry is old[600]: nothing from it on may go.
	if gone := missing(t, b.rdb, b.stream, append(append(old[600:], fresh...), concurrent...)); len(gone) > 0 {
		t.Fatalf("the trim removed %d entries a group still needs, first %s", len(gone), gone[0])
	}
	mid := b.rdb.XLen(ctx, b.stream).Val()
	if mid >= lenBefore+added.Load() {
		t.Fatalf("XLEN %d: nothing trimmed below the groups' needs (before %d + %d added)", mid, lenBefore, added.Load())
	}
	if len(streamLossAlerts(b.notifier)) > 0 {
		t.Fatalf("the reaper's own trim was alerted as a loss: %+v", streamLossAlerts(b.notifier))
	}

	// Both groups read and ack everything: only the retention bounds the trim now.
	for _, g := range []string{b.group, otherGroup} {
		readAck(t, b.rdb, b.stream, g, "catch-up", 100_000, 100_000)
		if p := b.rdb.XPending(ctx, b.stream, g).Val(); p.Count > 0 {
			if err := b.rdb.XAck(ctx, b.stream, g, pendingIDs(t, b.rdb, b.stream, g)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after := b.rdb.XLen(ctx, b.stream).Val()
	keep := int64(len(fresh)) + added.Load()
	// "~" keeps the radix-tree node that straddles the bound: at most one
	// node's entries (stream-node-max-entries, 100 by default) older than
	// the retention remain.
	if after < keep || after > keep+100 {
		t.Fatalf("XLEN %d after both groups acked: want the %d entries within the retention (+ at most one node)", after, keep)
	}
	if gone := missing(t, b.rdb, b.stream, append(fresh, concurrent...)); len(gone) > 0 {
		t.Fatalf("%d entries within the retention were trimmed, first %s", len(gone), gone[0])
	}
	memAfter, usedAfter := b.rdb.MemoryUsage(ctx, b.stream, 0).Val(), usedMemory(t, b.rdb)
	if memAfter >= memBefore {
		t.Fatalf("MEMORY USAGE of the stream %d → %d: did not shrink", memBefore, memAfter)
	}
	t.Logf("XLEN %d → %d → %d; MEMORY USAGE %d → %d bytes; used_memory %d → %d (the whole server, other tests included)",
		lenBefore, mid, after, memBefore, memAfter, usedBefore, usedAfter)
	if got := testutilCounter(t, reg, "pelguard_reaper_stream_trimmed_total"); got != float64(lenBefore+added.Load()-after) {
		t.Fatalf("pelguard_reaper_stream_trimmed_total %v, want %d", got, lenBefore+added.Load()-after)
	}
}

// TestTrimRetentionAlone: with every entry read and acked, nothing younger
// than the retention (by the injected clock) is trimmed; moving the clock
// past it trims them.
func TestTrimRetentionAlone(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ids := b.add(t, evs(500)...)
	readAck(t, b.rdb, b.stream, b.group, "billing-1", 1000, 1000)
	cfg := b.config(t, "reaper-retention")
	cfg.MinIdle = time.Hour
	r := b.newReaper(t, cfg)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.rdb.XLen(ctx, b.stream).Val(); n != 500 {
		t.Fatalf("XLEN %d: entries younger than the retention were trimmed", n)
	}
	b.clk.Advance(reaper.DefaultStreamRetention + time.Minute)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The group's last delivered entry is kept: it is the bound.
	if n := b.rdb.XLen(ctx, b.stream).Val(); n > 100 {
		t.Fatalf("XLEN %d: the retention passed and nothing was trimmed", n)
	}
	if gone := missing(t, b.rdb, b.stream, ids[len(ids)-1:]); len(gone) > 0 {
		t.Fatalf("the group's last delivered entry %s was trimmed", gone[0])
	}
	if n := b.rdb.XLen(ctx, consumer.DeadLetterStream(b.stream)).Val(); n != 0 {
		t.Fatalf("dead letters: %d", n)
	}
}

// TestTrimNeverTouchesDeadLetters: a dead-letter stream older than the
// retention stays whole; past --dead-letter-max it is alerted, with its
// size and its oldest entry's age by the injected clock.
func TestTrimNeverTouchesDeadLetters(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	dead := consumer.DeadLetterStream(b.stream)
	xaddAt(t, b.rdb, dead, b.clk.Now().Add(-10*24*time.Hour).UnixMilli(), 30)
	reg := prometheus.NewRegistry()
	cfg := b.config(t, "reaper-dead")
	cfg.MinIdle, cfg.DeadLetterMax, cfg.DeadLetterMaxAge, cfg.Metrics = time.Hour, 50, -1, reaper.NewMetrics(reg)
	r := b.newReaper(t, cfg)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.rdb.XLen(ctx, dead).Val(); n != 30 {
		t.Fatalf("dead letters trimmed: XLEN %d, want 30", n)
	}
	if got := countKind(b.notifier, alerts.KindDeadLettersWaiting); got != 0 {
		t.Fatalf("%d dead-letter alerts below the size threshold (the age check is off)", got)
	}
	if v := testutilGauge(t, reg, "pelguard_reaper_dead_letter_oldest_seconds"); v < (10*24*time.Hour).Seconds()-60 {
		t.Fatalf("oldest dead letter's age %vs, want 10 days", v)
	}
	xaddAt(t, b.rdb, dead, b.clk.Now().Add(-9*24*time.Hour).UnixMilli(), 20)
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := countKind(b.notifier, alerts.KindDeadLettersWaiting); got != 1 {
		t.Fatalf("%d dead-letter alerts at 50 entries over two passes, want 1", got)
	}

	// The age threshold alone, on another reaper.
	cfg.DeadLetterMax, cfg.DeadLetterMaxAge, cfg.Metrics = -1, 9*24*time.Hour+time.Hour, nil
	n2 := alerts.NewMemory()
	cfg.Notifier = n2
	if _, err := b.newReaper(t, cfg).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := countKind(n2, alerts.KindDeadLettersWaiting); got != 1 {
		t.Fatalf("%d dead-letter alerts with the oldest 10 days old and a 9-day threshold, want 1", got)
	}
	a := n2.Alerts()[0]
	if !strings.Contains(a.Title, "50 dead letters") || !strings.Contains(a.Title, dead) {
		t.Fatalf("alert title %q: want the size and the stream", a.Title)
	}
}

func evs(n int) []event.Event { // helpers shared by the trim tests
	out := make([]event.Event, n)
	for i := range out {
		out[i] = ev(i)
	}
	return out
}

func pendingIDs(t testing.TB, rdb *redis.Client, stream, group string) []string {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group,
		Start: "-", End: "+", Count: 1_000_000}).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(p))
	for i, e := range p {
		ids[i] = e.ID
	}
	return ids
}

func countKind(n *alerts.Memory, k alerts.Kind) int {
	c := 0
	for _, a := range n.Alerts() {
		if a.Kind == k {
			c++
		}
	}
	return c
}

func testutilCounter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return gatherSum(t, reg, name)
}

func testutilGauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return gatherSum(t, reg, name)
}

// gatherSum sums every series of the family name.
func gatherSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
