package reapercli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

func TestBadFlagsExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"--log-format", "xml"},
		{"--stream", "=g"},
		{"--json"},                    // without --dry-run
		{"--stream-retention", "12h"}, // below the safe window + the repair's reach
		{"--stream-retention", "168h", "--safe-key-window", "167h"}, // the same against a longer window
		{"--stream-retention", "-1h"},
		{"--dead-letter-max", "-5"},
		{"migrate", "sideways"},
		{"unexpected-arg"},
	} {
		var out, errb testenv.SyncBuffer
		if code := Main(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
		if errb.Len() == 0 {
			t.Errorf("%v: no message", args)
		}
	}
	var out, errb testenv.SyncBuffer
	if code := Main(context.Background(), []string{"--stream-retention", "12h"}, &out, &errb); !strings.Contains(errb.String(), "at least 24h5m0s") {
		t.Errorf("--stream-retention 12h: exit %d, the message does not name the minimum: %s", code, errb.String())
	}
	out, errb = testenv.SyncBuffer{}, testenv.SyncBuffer{}
	if code := Main(context.Background(), []string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--dry-run") {
		t.Errorf("--help: exit %d: %s", code, errb.String())
	}
}

type world struct {
	rdb    *redis.Client
	dbURL  string
	stream string
	group  string
}

// abandoned puts one event on a fresh stream, read by a consumer that died.
func abandoned(t *testing.T) world {
	t.Helper()
	_, url := testenv.DBWithURL(t)
	w := world{rdb: testenv.Redis(t), dbURL: url, stream: testenv.Name(t, "billing"), group: "billing-group"}
	testenv.CleanupKeys(t, w.rdb, w.stream, consumer.DeadLetterStream(w.stream))
	ctx := context.Background()
	if err := consumer.EnsureGroup(ctx, w.rdb, w.stream, w.group); err != nil {
		t.Fatal(err)
	}
	e := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	if err := w.rdb.XAdd(ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
		t.Fatal(err)
	}
	// A pelguard consumer that registered, read and died.
	if err := consumer.Register(ctx, w.rdb, w.stream, w.group, "dead", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: "dead",
		Streams: []string{w.stream, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		p, err := w.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: w.stream, Group: w.group,
			Idle: 5 * time.Millisecond, Start: "-", End: "+", Count: 10}).Result()
		return err == nil && len(p) == 1
	}, "the entry idle")
	return w
}

func (w world) args(extra ...string) []string {
	return append([]string{"--once", "--stream", w.stream + "=" + w.group, "--min-idle", "1ms",
		"--redis-url", testenv.RedisURL(), "--database-url", w.dbURL, "--db-schema", testenv.SchemaOfURL(w.dbURL), "--metrics-addr", "", "--namespace", "test"}, extra...)
}

func TestDryRunOncePrintsDecisionsAndChangesNothing(t *testing.T) {
	t.Parallel()
	w := abandoned(t)
	for _, asJSON := range []bool{true, false} {
		var out, errb testenv.SyncBuffer
		args := w.args("--dry-run")
		if asJSON {
			args = append(args, "--json")
		}
		if code := Main(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		if asJSON {
			var d reaper.Decision
			if err := json.Unmarshal(bytes.TrimSpace([]byte(out.String())), &d); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			if d.Kind != reaper.KindClaim || !d.DryRun || d.Key != "c_1/2026-11" || d.Consumer != "dead" {
				t.Fatalf("decision %+v", d)
			}
		} else if s := out.String(); !strings.Contains(s, "DECISION") || !strings.Contains(s, "claim") ||
			!strings.Contains(s, "nothing changed") {
			t.Fatalf("table:\n%s", s)
		}
	}
	p, err := w.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: w.stream, Group: w.group,
		Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(p) != 1 || p[0].Consumer != "dead" || p[0].RetryCount != 1 {
		t.Fatalf("PEL %+v (%v), want the entry untouched", p, err)
	}
}

func TestOnceRedrivesThroughStripe(t *testing.T) {
	t.Parallel()
	w := abandoned(t)
	sim, err := stripesim.New(stripesim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	var out, errb testenv.SyncBuffer
	args := w.args("--stripe-key", "sk_test_reaper_cmd", "--stripe-api-base", sim.URL(), "--stripe-mode", "charges")
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := sim.SucceededCharges("c_1", "2026-11"); n != 1 {
		t.Fatalf("%d charges, want 1\n%s", n, errb.String())
	}
	p, err := w.rdb.XPending(context.Background(), w.stream, w.group).Result()
	if err != nil || p.Count != 0 {
		t.Fatalf("pending %+v (%v), want none", p, err)
	}
}

// `reaper run --meter-stream` re-drives a dead meter consumer's events
// through the meter ledger: each counted once at Stripe; --stream is not
// needed (and billing-stream is not reaped).
func TestOnceRedrivesMeterEvents(t *testing.T) {
	t.Parallel()
	_, url := testenv.DBWithURL(t)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	stream, group := testenv.Name(t, "usage"), "meters"
	testenv.CleanupKeys(t, rdb, stream, consumer.DeadLetterStream(stream))
	if err := consumer.EnsureGroup(ctx, rdb, stream, group); err != nil {
		t.Fatal(err)
	}
	sim, err := stripesim.New(stripesim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_1", Value: int64(i + 1),
			Timestamp: time.Now().Add(-time.Minute).Truncate(time.Second), EventID: "req-" + string(rune('a'+i))}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "dead",
		Streams: []string{stream, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // idle past --min-idle 1ms
	var out, errb testenv.SyncBuffer
	args := []string{"--once", "--meter-stream", stream + "=" + group, "--min-idle", "1ms",
		"--redis-url", testenv.RedisURL(), "--database-url", url, "--db-schema", testenv.SchemaOfURL(url),
		"--metrics-addr", "", "--namespace", "test",
		"--stripe-key", "sk_test_reaper_cmd", "--stripe-api-base", sim.URL()}
	if code := Main(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := sim.MeterTotal("api_requests", "cus_1"); got != 6 {
		t.Fatalf("Stripe counts %d, want 6 (1+2+3)\n%s", got, errb.String())
	}
	p, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil || p.Count != 0 {
		t.Fatalf("pending %+v (%v), want none", p, err)
	}
	for _, bad := range [][]string{{"--meter-stream", "=g"}, {"--meter-stream", "u", "--meter-safe-window", "25h"}} {
		var out, errb testenv.SyncBuffer
		if code := Main(ctx, append(bad, "--dry-run"), &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%v: exit %d, want 2 with a message (%s)", bad, code, errb.String())
		}
	}
}
