package console

import (
	"context"
	"fmt"
	"html"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// TestOverviewShowsLostEntries: with the consumers stopped, a producer
// publishes 1,000 events with MAXLEN ~ 100. A reaper pass (the real one,
// dry-run off, on the same Redis, watching the group before the flood)
// records the loss, and the overview shows
// the stream, the group, the count and the id range, in the line the alert
// also names.
func TestOverviewShowsLostEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	testenv.CleanupKeys(t, b.rdb, reaper.LossesKey(b.stream))
	if err := consumer.EnsureGroup(ctx, b.rdb, b.stream, b.group); err != nil {
		t.Fatal(err)
	}
	c := b.login(t, "alice")
	if page := c.mustGet("/"); !strings.Contains(page, "none seen by the reaper") {
		t.Fatal("the overview does not say that no loss was seen")
	}
	r, mem := newReaper(t, b)
	if _, err := r.RunOnce(ctx); err != nil { // the reaper watches the group before the loss
		t.Fatal(err)
	}
	for i := range 1000 {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, MaxLen: 100, Approx: true,
			Values: map[string]any{"payload": fmt.Sprintf(`{"customer_id":"c%d"}`, i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	first := b.rdb.XRangeN(ctx, b.stream, "-", "+", 1).Val()[0].ID
	lost := 1000 - b.rdb.XLen(ctx, b.stream).Val()
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if as := mem.Alerts(); len(as) != 1 || as[0].Kind != alerts.KindStreamEntriesLost {
		t.Fatalf("alerts %+v: want one stream_entries_lost", as)
	}
	page := html.UnescapeString(c.mustGet("/"))
	i := strings.Index(page, `id="losses"`)
	if i < 0 {
		t.Fatal("no losses table on the overview")
	}
	row := page[i:min(len(page), i+2000)]
	for _, want := range []string{b.stream, b.group, "trimmed before the group read them", fmt.Sprintf(">%d<", lost), "above 0-0, below " + first} {
		if !strings.Contains(row, want) {
			t.Errorf("the overview's loss line lacks %q:\n%s", want, row)
		}
	}
}

// newReaper is the real reaper on the console's stream, its alerts in
// memory.
func newReaper(t *testing.T, b *bundle) (*reaper.Reaper, *alerts.Memory) {
	t.Helper()
	mem := alerts.NewMemory()
	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, Stripe: b.cfg.Stripe,
		Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, MinIdle: time.Hour, Namespace: testNS,
		Notifier: mem, Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	return r, mem
}
