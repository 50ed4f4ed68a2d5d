package console

import (
	"context"
	"html"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// pelWorld is a PEL with one entry of each situation the page must tell
// apart, by entry id: a live consumer inside a slow Stripe call (its
// ledger lease is live), a dead consumer whose entry is safe to reclaim
// (registered, silent for an hour, lease expired), an entry already charged
// in the ledger (killed before XACK), and one of a team's consumer that
// never registered.
type pelWorld struct {
	live, dead, charged, legacy string
}

func (b *bundle) seedPEL(t testing.TB) pelWorld {
	t.Helper()
	ctx := context.Background()
	testenv.CleanupKeys(t, b.rdb, consumer.LivenessKey(b.stream, b.group), reaper.PassesKey(b.stream))
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "$").Err(); err != nil {
		t.Fatal(err)
	}
	ev := func(cust string) event.Event {
		return event.Event{CustomerID: cust, StripeCustomerID: "cus_" + cust, AmountCents: 2500, BillingPeriod: testPeriod, Currency: "usd"}
	}
	add := func(cust string) string {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{event.PayloadField: ev(cust).Payload()}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	read := func(name string, n int64) {
		if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: name, Streams: []string{b.stream, ">"}, Count: n}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var w pelWorld
	w.live = add("clive")
	read("consumer-live", 1)
	w.dead, w.charged = add("cdead"), add("ccharged")
	read("consumer-dead", 2)
	w.legacy = add("clegacy")
	read("legacy-billing-1", 1)
	now := b.clk.Now()
	for name, at := range map[string]time.Time{"consumer-live": now.Add(-5 * time.Second), "consumer-dead": now.Add(-time.Hour)} {
		if err := consumer.Register(ctx, b.rdb, b.stream, b.group, name, at); err != nil {
			t.Fatal(err)
		}
	}
	row := func(cust, msgID string, st ledger.Status, owner string, exp time.Time, charge string) ledger.Record {
		return ledger.Record{Key: ledger.Key{CustomerID: cust, BillingPeriod: testPeriod}, StripeCustomerID: "cus_" + cust,
			AmountCents: 2500, Currency: "usd", IdempotencyKey: key(cust), Status: st, LeaseOwner: owner, LeaseExpiresAt: exp,
			ChargeID: charge, StreamMessageID: msgID, FirstAttemptAt: now.Add(-time.Hour)}
	}
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{
		row("clive", w.live, ledger.StatusPending, "consumer-live", now.Add(40*time.Second), ""),
		row("cdead", w.dead, ledger.StatusPending, "consumer-dead", now.Add(-50*time.Minute), ""),
		row("ccharged", w.charged, ledger.StatusCharged, "", time.Time{}, "ch_seeded_charged"),
	}); err != nil {
		t.Fatal(err)
	}
	// The reaper's XPENDING IDLE 1ms must see all four: wait for Redis's
	// own clock to pass a millisecond.
	testenv.Eventually(t, 5*time.Second, func() bool {
		p, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: b.group, Idle: time.Millisecond,
			Start: "-", End: "+", Count: 10}).Result()
		return err == nil && len(p) == 4
	}, "four idle pending entries")
	return w
}

var pelRowRe = regexp.MustCompile(`<tr id="pel-([0-9-]+)" data-kind="([a-z_]+)">`)

// pageVerdicts reads entry id → kind off the PEL page.
func pageVerdicts(page string) map[string]string {
	out := map[string]string{}
	for _, m := range pelRowRe.FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestPELVerdictsEqualReaperDryRun: the PEL page's verdict for every entry
// is the reaper's: a dry-run pass of a real reaper over the same PEL,
// ledger and clock decides the same kind for each entry, and the page
// changes nothing (entries, deliveries and ledger rows as they were).
func TestPELVerdictsEqualReaperDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Reaper.MinIdle = time.Millisecond })
	w := b.seedPEL(t)
	ctx := context.Background()

	var mu sync.Mutex
	dry := map[string]reaper.Decision{}
	r, err := reaper.New(reaper.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, DryRun: true, MinIdle: time.Millisecond,
		Streams: []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}, Clock: b.clk, Logger: testenv.Logger(t),
		OnDecision: func(d reaper.Decision) {
			mu.Lock()
			defer mu.Unlock()
			dry[d.ID] = d
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}

	const rowsNow = `SELECT string_agg(customer_id || ':' || status || ':' || coalesce(lease_owner, '') || ':' || epoch || ':' || attempts, ',' ORDER BY customer_id)
		FROM {schema}.billing_records`
	var before, after string
	if err := b.pool.QueryRow(ctx, rowsNow).Scan(&before); err != nil {
		t.Fatal(err)
	}
	alice := b.login(t, "alice")
	page := alice.mustGet("/pel?stream=" + b.stream)
	got := pageVerdicts(page)
	want := map[string]string{w.live: string(reaper.KindLeaseLive), w.dead: string(reaper.KindClaim),
		w.charged: string(reaper.KindAlreadyBilled), w.legacy: string(reaper.KindUnregistered)}
	if len(got) != len(want) {
		t.Fatalf("page shows %d entries, want %d: %v", len(got), len(want), got)
	}
	for id, kind := range want {
		d, ok := dry[id]
		if !ok {
			t.Fatalf("the reaper's dry run decided nothing for %s", id)
		}
		if string(d.Kind) != kind {
			t.Errorf("the reaper's dry run decided %s for %s, the test expects %s", d.Kind, id, kind)
		}
		if got[id] != string(d.Kind) {
			t.Errorf("entry %s: page says %q, the reaper's dry run %q (%s)", id, got[id], d.Kind, d.Reason)
		}
		if d.Reason != "" && !strings.Contains(page, html.EscapeString(d.Reason)) {
			t.Errorf("entry %s: the page does not give the reaper's reason %q", id, d.Reason)
		}
	}
	for _, s := range []string{"consumer-live", "heartbeat 5s ago", "never registered", "ccharged/" + testPeriod} {
		if !strings.Contains(page, s) {
			t.Errorf("the PEL page does not show %q", s)
		}
	}

	// Read-only: the page (and the dry run) changed nothing.
	pend, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: b.group, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(pend) != 4 {
		t.Fatalf("%d entries pending after the page, want 4", len(pend))
	}
	for _, p := range pend {
		if p.RetryCount != 1 {
			t.Errorf("entry %s delivered %d times after the page, want 1 (nothing claimed)", p.ID, p.RetryCount)
		}
	}
	if err := b.pool.QueryRow(ctx, rowsNow).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("ledger rows changed by the page:\nbefore %s\nafter  %s", before, after)
	}

	// One owner's entries alone.
	if v := pageVerdicts(alice.mustGet("/pel?stream=" + b.stream + "&consumer=consumer-dead")); len(v) != 2 || v[w.dead] != "claim" {
		t.Errorf("consumer-dead's entries: %v", v)
	}
}
