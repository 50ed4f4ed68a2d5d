package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A meter-event stream's PEL (`--meter-stream`) is judged against the
// meter ledger: a delivered event's entry is acked without a call, an
// entry with no row is claimed and re-driven, and the row shows the
// customer, the meter and the units.
func TestPELOfAMeterStream(t *testing.T) {
	t.Parallel()
	usage := testenv.Name(t, "usage")
	b := setup(t, func(c *Config) {
		c.Reaper.MinIdle = time.Millisecond
		c.Streams = append(c.Streams, Stream{Name: usage, Group: "meters", Meter: true})
	})
	testenv.CleanupKeys(t, b.rdb, usage)
	ctx := context.Background()
	if err := b.rdb.XGroupCreateMkStream(ctx, usage, "meters", "$").Err(); err != nil {
		t.Fatal(err)
	}
	at := b.clk.Now().Add(-time.Minute).Truncate(time.Second)
	delivered := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_m1", Value: 7, Timestamp: at, EventID: "e1"}
	fresh := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_m2", Value: 2, Timestamp: at, EventID: "e2"}
	var ids []string
	for _, e := range []event.MeterEvent{delivered, fresh} {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: usage, Values: map[string]any{event.PayloadField: e.Payload()}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "meters", Consumer: "meter-dead", Streams: []string{usage, ">"}, Count: 10}).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := meterledger.New(b.cfg.DB, meterledger.Config{Schema: b.cfg.Schema, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	// The console's default namespace is the consumers' default.
	claims, err := l.Reserve(ctx, []meterledger.Request{{Event: delivered, Identifier: delivered.Identifier(consumer.DefaultNamespace), Owner: "meter-dead", Lease: time.Second}})
	if err != nil || !claims[0].Decision.MaySend() {
		t.Fatalf("reserve %+v %v", claims, err)
	}
	if _, err := l.Finish(ctx, []meterledger.Outcome{{Hold: claims[0].Hold(), Result: meterledger.Delivered}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		p, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: usage, Group: "meters", Idle: time.Millisecond, Start: "-", End: "+", Count: 10}).Result()
		return err == nil && len(p) == 2
	}, "two idle pending meter entries")
	page := b.login(t, "alice").mustGet("/pel?stream=" + usage)
	got := pageVerdicts(page)
	if got[ids[0]] != "already_billed" || got[ids[1]] != "claim" {
		t.Fatalf("verdicts %v: want the delivered one acked, the other claimed", got)
	}
	for _, s := range []string{"cus_m1 · api_requests", "7 units", "meter event delivered"} {
		if !strings.Contains(page, s) {
			t.Errorf("the meter PEL page lacks %q", s)
		}
	}
}
