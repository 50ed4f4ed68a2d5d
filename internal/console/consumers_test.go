package console

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

var (
	panelRow  = regexp.MustCompile(`(?s)<tr id="consumer-([^"]+)" class="[^"]*" data-state="([a-z]+)">(.*?)</tr>`)
	pelOwner  = regexp.MustCompile(`(?s)<tr id="pel-[^"]+" data-kind="[^"]*">\s*<td class="mono">[^<]*</td>\s*<td><a href="[^"]*">([^<]+)</a><br>\s*<span class="small cs cs-([a-z]+)"[^>]*>([^<]*)</span>`)
	tagOrSpan = regexp.MustCompile(`<[^>]+>`)
)

// panelStates reads the consumers panel: name → state key, and the row's
// text.
func panelStates(page string) (map[string]string, map[string]string) {
	keys, texts := map[string]string{}, map[string]string{}
	for _, m := range panelRow.FindAllStringSubmatch(page, -1) {
		keys[m[1]], texts[m[1]] = m[2], strings.Join(strings.Fields(tagOrSpan.ReplaceAllString(m[3], " ")), " ")
	}
	return keys, texts
}

// The consumers panel tells the truth about every kind of consumer, with
// real consumers running against the real Redis: a running meter consumer
// registers and beats like a billing consumer (live, with the events it
// handled: it was "never registered", like a crashed one); a registered
// consumer that stopped beating is silent; a group member that never
// registered is said so, and one named in --stopped-consumers is stopped;
// each state agrees with the liveness registry read directly, and the PEL
// page names each owner's state in the same words. Consumers gone longer
// than --consumer-idle and holding nothing leave the panel (counted), and
// a holder stays however long it is gone.
func TestConsumersPanelStatesAgree(t *testing.T) {
	t.Parallel()
	meters := testenv.Name(t, "usage")
	b := setup(t, func(c *Config) {
		c.Reaper.MinIdle = time.Millisecond
		c.Reaper.StoppedConsumers = []string{"legacy-stopped"}
		c.ConsumerIdle = 10 * time.Minute
		c.Streams = append(c.Streams, Stream{Name: meters, Group: "meters", Meter: true})
	})
	ctx := context.Background()
	testenv.CleanupKeys(t, b.rdb, meters, consumer.LivenessKey(meters, "meters"), consumer.StatsKey(meters, "meters", "meter-running"),
		consumer.StatsKey(b.stream, b.group, "billing-running"))
	w := b.seedPEL(t) // consumer-live (beat 5 s ago), consumer-dead (silent 1 h, holds 2), legacy-billing-1 (never registered, holds 1)
	_ = w
	add := func(stream string, fields map[string]any) {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: fields}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// legacy-stopped holds one entry and is named in --stopped-consumers.
	add(b.stream, map[string]any{event.PayloadField: event.Event{CustomerID: "cstop", StripeCustomerID: "cus_cstop", AmountCents: 100,
		BillingPeriod: testPeriod, Currency: "usd"}.Payload()})
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: "legacy-stopped", Streams: []string{b.stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	// Registered long ago, gone from the group, holding nothing: gone.
	// Registered 5 minutes ago, holding nothing: silent, still listed.
	for name, at := range map[string]time.Time{"gone-long-ago": b.clk.Now().Add(-2 * time.Hour), "silent-recently": b.clk.Now().Add(-5 * time.Minute)} {
		if err := consumer.Register(ctx, b.rdb, b.stream, b.group, name, at); err != nil {
			t.Fatal(err)
		}
	}

	// A real meter consumer, its meter at the emulator, and a real billing consumer.
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XGroupCreateMkStream(ctx, meters, "meters", "0").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 4
	for i := range n {
		add(meters, map[string]any{event.PayloadField: event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_m%d", i),
			Value: 3, Timestamp: b.clk.Now().Add(-time.Minute).Truncate(time.Second), EventID: fmt.Sprintf("m%d", i)}.Payload()})
	}
	mc, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, Stripe: b.cfg.Stripe,
		Stream: meters, Group: "meters", Name: "meter-running", Block: 50 * time.Millisecond, Lease: 900 * time.Millisecond,
		Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stopMeter := context.WithCancel(ctx)
	meterDone := make(chan error, 1)
	go func() { meterDone <- mc.Run(mctx) }()
	t.Cleanup(func() { stopMeter(); <-meterDone })
	bc, err := consumer.New(consumer.Config{Redis: b.rdb, DB: b.cfg.DB, Schema: b.cfg.Schema, Stripe: b.cfg.Stripe, Stream: b.stream,
		Group: b.group, Name: "billing-running", Namespace: testNS, Block: 50 * time.Millisecond, Lease: 900 * time.Millisecond,
		Logger: testenv.Logger(t), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := bc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bc.Stop(context.Background()) })
	b.waitMeterHandled(t, meters, "meters", "meter-running", meterDone, n)
	for i := range n {
		if got := len(b.sim.MeterEvents("api_requests", fmt.Sprintf("cus_m%d", i))); got != 1 {
			t.Fatalf("cus_m%d: %d meter events at the emulator, want 1", i, got)
		}
	}

	c := b.login(t, "alice")
	page := c.mustGet("/")
	keys, texts := panelStates(page)
	want := map[string]string{"meter-running": stateLive, "billing-running": stateLive, "consumer-live": stateLive,
		"consumer-dead": stateSilent, "silent-recently": stateSilent, "legacy-billing-1": stateUnregistered, "legacy-stopped": stateStopped}
	for name, k := range want {
		if keys[name] != k {
			t.Errorf("panel: %s is %q (%s), want %q", name, keys[name], texts[name], k)
		}
	}
	if _, ok := keys["gone-long-ago"]; ok {
		t.Errorf("a consumer gone 2 h (over --consumer-idle 10m) holding nothing is listed: %s", texts["gone-long-ago"])
	}
	if !strings.Contains(page, "1 consumer gone longer than --consumer-idle (10m0s) and holding nothing left out") {
		t.Error("the panel does not say it left one consumer out")
	}
	// stream, name, state, held, events/s, events, idle
	// The events it handled as it published them: at least n (an entry
	// met twice counts twice), at most what it has published since.
	handled := b.meterHandled(t, meters, "meters", "meter-running")
	if f := strings.Fields(texts["meter-running"]); len(f) < 9 || strings.Join(f[2:6], " ") != "live, heartbeat 0s ago" || f[6] != "0" ||
		!between(f[8], n, handled) {
		t.Errorf("the meter consumer's row: %q (want live, 0 held, %d to %d events)", texts["meter-running"], n, handled)
	}
	// Each state agrees with the liveness registry read directly.
	for _, st := range b.cfg.Streams {
		beats, err := consumer.Registered(ctx, b.rdb, st.Name, st.Group)
		if err != nil {
			t.Fatal(err)
		}
		for name, k := range keys {
			at, registered := beats[name]
			live := registered && b.clk.Now().Sub(at) <= consumer.DefaultLease
			if registered && (k == stateLive) != live || registered && k != stateLive && k != stateSilent {
				t.Errorf("%s: registered %v at %s, panel says %s", name, registered, at, k)
			}
			if _, ok := beats[name]; !ok && (k == stateLive || k == stateSilent) && !registeredElsewhere(ctx, t, b, name) {
				t.Errorf("%s: not registered, panel says %s", name, k)
			}
		}
	}
	// The PEL page names each owner's state as the panel does.
	pel := c.mustGet("/pel?stream=" + url.QueryEscape(b.stream))
	owners := pelOwner.FindAllStringSubmatch(pel, -1)
	if len(owners) < 4 {
		t.Fatalf("the PEL page lists %d owned entries, want at least 4", len(owners))
	}
	seen := map[string]bool{}
	for _, m := range owners {
		seen[m[1]] = true
		if keys[m[1]] != m[2] {
			t.Errorf("PEL page: owner %s is %q (%s), the panel says %q", m[1], m[2], m[3], keys[m[1]])
		}
		if strings.TrimSpace(m[3]) == "registered" {
			t.Errorf("PEL page calls %s plainly registered", m[1])
		}
	}
	for _, name := range []string{"consumer-dead", "legacy-billing-1", "legacy-stopped"} {
		if !seen[name] {
			t.Errorf("the PEL page does not list %s's entries", name)
		}
	}

	// A member idle past --consumer-idle, holding nothing, leaves too; a
	// holder stays. Another console with --consumer-idle 1s, after 1.2 s.
	if err := b.rdb.XGroupCreateConsumer(ctx, b.stream, b.group, "idle-member").Err(); err != nil {
		t.Fatal(err)
	}
	if k, _ := panelStates(c.mustGet("/")); k["idle-member"] != stateUnregistered {
		t.Errorf("a fresh idle member: %q, want listed as never registered", k["idle-member"])
	}
	time.Sleep(1200 * time.Millisecond)
	cfg := b.cfg
	cfg.ConsumerIdle = time.Second
	short, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(short)
	t.Cleanup(srv.Close)
	sb := *b
	sb.srv = srv
	k2, t2 := panelStates(sb.login(t, "bob").mustGet("/"))
	for _, name := range []string{"idle-member", "silent-recently", "gone-long-ago"} {
		if _, ok := k2[name]; ok {
			t.Errorf("--consumer-idle 1s: %s is still listed (%s)", name, t2[name])
		}
	}
	for _, name := range []string{"meter-running", "billing-running", "consumer-dead", "legacy-billing-1", "legacy-stopped"} {
		if _, ok := k2[name]; !ok {
			t.Errorf("--consumer-idle 1s: %s (live or holding) left the panel", name)
		}
	}
}

// registeredElsewhere: name is registered on another of the console's
// streams (the panel lists each stream's consumers).
func registeredElsewhere(ctx context.Context, t *testing.T, b *bundle, name string) bool {
	for _, st := range b.cfg.Streams {
		beats, err := consumer.Registered(ctx, b.rdb, st.Name, st.Group)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := beats[name]; ok {
			return true
		}
	}
	return false
}
