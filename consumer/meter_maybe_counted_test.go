package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// An event whose first call reached Stripe with its reply lost, retried
// with a key Stripe then refuses (401), may have counted: it is parked, not
// failed, and its units stay counted for the caps. Replayed 25 h later
// (Stripe no longer guards its identifier), the replay is refused without
// an override and Stripe counts the event once; with one, the row is sent
// again and records who, when and why.
func TestMeterMaybeCountedEventIsNeverFailedNorReplayed(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	clk := newSimClock(now)
	b := setup(t, opts{clk: clk, simNow: now})
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	e := meterEvent(4, 3, now.Add(-time.Minute)) // value 4
	b.addMeter(t, e)
	msgs := b.read(t, "m-a", 1)
	if err := b.sim.SetFaults(stripesim.Faults{DropNextMeterEvents: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if first, err := b.meterConsumer(t, "m-a").ProcessBatch(ctx, msgs); err != nil || first.Left != 1 {
		t.Fatalf("first call %+v %v: want the lost reply left pending", first, err)
	}
	// The key is revoked before the retry.
	bad, err := stripeapi.New(stripeapi.Config{APIKey: "rk_test_revoked", BaseURL: b.sim.URL(), MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	mem := alerts.NewMemory()
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: bad, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Notifier: mem, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	retry, err := c.ProcessBatch(ctx, msgs)
	if err != nil || retry.Parked != 1 {
		t.Fatalf("retry with a revoked key %+v %v: want the event parked (an earlier attempt may have counted)", retry, err)
	}
	ml, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	id := e.Identifier("test")
	rec, err := ml.Get(ctx, meterledger.KeyOf(e, id))
	if err != nil || rec.Status != meterledger.StatusParked {
		t.Fatalf("row %+v %v: want parked", rec, err)
	}
	if us, err := ml.Usage(ctx, meterName, e.StripeCustomerID, e.Timestamp); err != nil || len(us) != 1 || us[0].Units != 4 {
		t.Fatalf("use of the meter %+v %v: want the 4 units still counted for the caps", us, err)
	}
	dl, err := b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters %v %v: want one", dl, err)
	}
	// 25 h later the key is fixed and the operator replays.
	clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	replay := func(extra map[string]any) consumer.MeterBatch {
		t.Helper()
		v := map[string]any{"payload": e.Payload(), consumer.ReplayedFromField: dl[0].ID}
		for k, x := range extra {
			v[k] = x
		}
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := b.meterConsumer(t, "m-a").ProcessBatch(ctx, b.read(t, "m-a", 1))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	refused := replay(nil)
	if refused.Delivered != 0 || refused.DeadLetters != 1 {
		t.Fatalf("replay without override %+v: want it refused (dead-lettered again), nothing sent", refused)
	}
	if got := b.sim.MeterTotal(meterName, e.StripeCustomerID); got != 4 {
		t.Fatalf("Stripe counts %d units, want the event's 4 once", got)
	}
	dl, err = b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != 2 || dl[1].Values["reason"] != consumer.ReasonMeterReplayRefused {
		t.Fatalf("dead letters %v %v: want the refused replay back with reason %s", dl, err, consumer.ReasonMeterReplayRefused)
	}
	// The operator checked at Stripe and overrides, saying why.
	why := "not in the meter's events at Stripe (by alice at 2026-12-05T10:00:00Z)"
	if got := replay(map[string]any{consumer.ReplayOverrideField: why}); got.Delivered != 1 {
		t.Fatalf("replay with override %+v: want it sent", got)
	}
	rec, err = ml.Get(ctx, meterledger.KeyOf(e, id))
	if err != nil || rec.Status != meterledger.StatusDelivered || rec.ReplayOverride != why {
		t.Fatalf("row %+v %v: want delivered with the override recorded", rec, err)
	}
	_ = event.MeterEvent{}
}
