package consumer_test

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

// An entry not acked whose event the usage repair parked (a ledger rollback
// lost its row, and it is past the safe window) is dead-lettered with the
// repair's reason when a consumer reads it, on either path, and nothing is
// sent. Replayed before anyone settled it, it is refused (Stripe may count
// it); a person who finds Stripe lacks it settles it and replays it, which
// sends it once. Settled before its entry was read, the entry is
// dead-lettered all the same, with the settlement, and replays alike.
func TestMeterEntryParkedByTheRepairIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per_event", "from_ledger"} {
		for _, settledFirst := range []bool{false, true} {
			name := mode
			if settledFirst {
				name += "/settled_before_read"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				parkedByTheRepair(t, mode == "from_ledger", settledFirst)
			})
		}
	}
}

func parkedByTheRepair(t *testing.T, fromLedger, settledFirst bool) {
	now := time.Now().UTC()
	b := meterWorld(t, now)
	ctx := context.Background()
	mk := func() *consumer.MeterConsumer {
		c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
			Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-a", Namespace: "test", Lease: 3 * time.Second,
			Logger: testenv.Logger(t), SendFromLedger: fromLedger})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	e := meterEvent(7, 3, now.Add(-25*time.Hour)) // value 4, past the safe window
	b.addMeter(t, e)
	msgs := b.read(t, "m-a", 1)
	ml, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	// What the repair writes for it (internal/repair decideUnacked): its
	// first attempt unknown, taken as the event's time.
	key := meterledger.KeyOf(e, e.Identifier("test"))
	reason := "the ledger lost rows in a rollback and this entry was not acked: not re-sent"
	res, err := ml.Restore(ctx, []meterledger.Restored{{Key: key, EventName: e.EventName, StripeCustomerID: e.StripeCustomerID,
		CustomerID: e.CustomerID, Value: e.Value, Status: meterledger.StatusParked, MessageID: msgs[0].ID, Reason: reason,
		FirstSentAt: e.Timestamp}}, false)
	if err != nil || res[0].Outcome != meterledger.RestoreInserted {
		t.Fatalf("restoring the parked row: %+v %v", res, err)
	}
	settle := func() {
		t.Helper()
		if _, err := ml.Settle(ctx, meterledger.Settlement{Key: key, Counted: false, By: "alice", Reason: "absent at Stripe"}); err != nil {
			t.Fatal(err)
		}
	}
	deadLetters := func() []redis.XMessage {
		t.Helper()
		dl, err := b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		return dl
	}
	replay := func(dl redis.XMessage) {
		t.Helper()
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream,
			Values: map[string]any{"payload": e.Payload(), consumer.ReplayedFromField: dl.ID}}).Err(); err != nil {
			t.Fatal(err)
		}
		c := mk()
		if _, err := c.ProcessBatch(ctx, b.read(t, "m-a", 1)); err != nil {
			t.Fatal(err)
		}
		if fromLedger {
			if _, err := c.SendRound(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if settledFirst {
		settle()
	}

	got, err := mk().ProcessBatch(ctx, msgs)
	if err != nil || got.Parked != 1 || got.Already != 0 || got.Left != 0 {
		t.Fatalf("batch %+v %v: want the entry dead-lettered as parked", got, err)
	}
	dl := deadLetters()
	want := reason
	if settledFirst {
		want = "settled as not counted at Stripe by alice"
	}
	if len(dl) != 1 {
		t.Fatalf("dead letters %v: want one", dl)
	}
	if v := dl[0].Values; v["reason"] != consumer.ReasonMeterParked || !strings.Contains(v["detail"].(string), want) || v["source_id"] != msgs[0].ID {
		t.Fatalf("dead letter %v: want reason %s, %q and the entry's id", v, consumer.ReasonMeterParked, want)
	}
	if p, err := b.rdb.XPending(ctx, b.stream, b.group).Result(); err != nil || p.Count != 0 {
		t.Fatalf("pending %+v %v: want the entry acked", p, err)
	}
	if n := b.sim.MeterTotal(meterName, e.StripeCustomerID); n != 0 {
		t.Fatalf("Stripe counts %d units: a parked event must not be sent", n)
	}

	if !settledFirst {
		// Replayed unsettled: Stripe may count it, so it is refused.
		replay(dl[0])
		dl = deadLetters()
		if len(dl) != 2 || dl[1].Values["reason"] != consumer.ReasonMeterReplayRefused {
			t.Fatalf("dead letters %v: want the unsettled replay refused (%s)", dl, consumer.ReasonMeterReplayRefused)
		}
		if n := b.sim.MeterEventCounts().Recorded; n != 0 {
			t.Fatalf("the emulator recorded %d meter events: an unsettled parked event was sent", n)
		}
		settle()
	}
	// Stripe lacks it, settled as such: its dead letter replayed sends it once.
	replay(dl[len(dl)-1])
	if n := b.sim.MeterTotal(meterName, e.StripeCustomerID); n != e.Value {
		t.Fatalf("Stripe counts %d units after the replay; want the event's %d once", n, e.Value)
	}
	if rec, err := ml.Get(ctx, key); err != nil || rec.Status != meterledger.StatusDelivered {
		t.Fatalf("row %+v %v: want delivered", rec, err)
	}
}

// A replay of a parked event older than Stripe takes (35 days) goes back to
// the dead letters saying so (its timestamp is refused before the ledger is
// asked); nothing is sent, and nothing is acked away.
func TestMeterReplayPastStripesDaysGoesBackToTheDeadLetters(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	clk := newSimClock(now)
	b := meterWorldWith(t, opts{clk: clk, simNow: now})
	ctx := context.Background()
	e := meterEvent(8, 2, now.Add(-time.Hour))
	b.addMeter(t, e)
	msgs := b.read(t, "m-a", 1)
	ml, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	if _, err := ml.Restore(ctx, []meterledger.Restored{{Key: meterledger.KeyOf(e, e.Identifier("test")), EventName: e.EventName,
		StripeCustomerID: e.StripeCustomerID, Value: e.Value, Status: meterledger.StatusParked, MessageID: msgs[0].ID,
		Reason: "parked by the repair"}}, false); err != nil {
		t.Fatal(err)
	}
	if got, err := b.meterConsumer(t, "m-a").ProcessBatch(ctx, msgs); err != nil || got.Parked != 1 {
		t.Fatalf("batch %+v %v: want the entry dead-lettered as parked", got, err)
	}
	clk.Advance(36 * 24 * time.Hour)
	b.sim.Advance(36 * 24 * time.Hour)
	dl, err := b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters %v %v: want one", dl, err)
	}
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload(),
		consumer.ReplayedFromField: dl[0].ID, consumer.ReplayOverrideField: "absent at Stripe"}}).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.meterConsumer(t, "m-a").ProcessBatch(ctx, b.read(t, "m-a", 1))
	if err != nil || got.DeadLetters != 1 || got.Already != 0 {
		t.Fatalf("replay 36 days on %+v %v: want it dead-lettered again", got, err)
	}
	dl, err = b.rdb.XRange(ctx, consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil || len(dl) != 2 || dl[1].Values["reason"] != event.ReasonTimestampOutside {
		t.Fatalf("dead letters %v %v: want the replay back with reason %s", dl, err, event.ReasonTimestampOutside)
	}
	if n := b.sim.MeterEventCounts().Recorded; n != 0 {
		t.Fatalf("the emulator recorded %d meter events: want none", n)
	}
}
