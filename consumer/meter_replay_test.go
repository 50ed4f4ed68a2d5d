package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// runConsumers runs cs until the test ends.
func runConsumers(t *testing.T, cs ...*consumer.MeterConsumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func (b *bundle) deadEntries(t *testing.T) []redis.XMessage {
	t.Helper()
	xs, err := b.rdb.XRange(context.Background(), consumer.DeadLetterStream(b.stream), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return xs
}

// Replay in send-from-ledger mode: an event Stripe refused (no such meter)
// is recorded failed and dead-lettered from the ledger's copy of its
// entry; once the meter exists, the operator's replay of that dead letter
// (the console's and the CLI's function) reopens the ledger's row queued,
// and it is counted once. The dead letter is gone; replaying it again is
// refused; another copy of the replayed entry is acked as delivered,
// never sent again.
func TestReplayFromTheLedgerReopensTheRowAndSendsOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now})
	testenv.CleanupKeys(t, b.rdb, consumer.DeadLetterStream(b.stream))
	e := meterEvent(3, 4, now.Add(-time.Minute))
	b.addMeter(t, e)
	runConsumers(t, b.ledgerMeterConsumer(t, "m-a"))
	var dead []redis.XMessage
	testenv.Eventually(t, 30*time.Second, func() bool { dead = b.deadEntries(t); return len(dead) == 1 }, "the refused event dead-lettered")
	if r, _ := dead[0].Values["reason"].(string); r != consumer.ReasonMeterRefused {
		t.Fatalf("dead letter %v: want reason %s", dead[0].Values, consumer.ReasonMeterRefused)
	}
	l := b.meterLedger(t)
	key := meterledger.KeyOf(e, e.Identifier("test"))
	if rec, err := l.Get(context.Background(), key); err != nil || rec.Status != meterledger.StatusFailed {
		t.Fatalf("row %+v %v: want failed", rec, err)
	}
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	rep, err := consumer.ReplayDeadLetter(context.Background(), b.rdb, b.stream, dead[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		rec, err := l.Get(context.Background(), key)
		return err == nil && rec.Status == meterledger.StatusDelivered
	}, "the replayed event delivered")
	b.assertMeterTotals(t, sums([]event.MeterEvent{e}))
	if _, err := consumer.ReplayDeadLetter(context.Background(), b.rdb, b.stream, dead[0].ID); !errors.Is(err, consumer.ErrNoDeadLetter) {
		t.Fatalf("a second replay of the dead letter: %v, want ErrNoDeadLetter", err)
	}
	// Another copy of the replayed entry (two replays racing).
	if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload(),
		consumer.ReplayedFromField: rep.DeadID}}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		p, err := b.rdb.XPending(context.Background(), b.stream, b.group).Result()
		l, _ := b.rdb.XInfoGroups(context.Background(), b.stream).Result()
		return err == nil && p.Count == 0 && len(l) == 1 && l[0].Lag == 0
	}, "the copy acked")
	if c := b.sim.MeterEventCounts(); c.Recorded != 1 {
		t.Fatalf("emulator counts %+v: want the event recorded once", c)
	}
	if n := len(b.deadEntries(t)); n != 0 {
		t.Fatalf("%d dead letters after the replay, want none", n)
	}
}

// Replay of an aggregate Stripe refused: its two members are dead-lettered
// from the ledger's copies; replayed once the meter exists, they are sent
// again and the customer counts their sum once.
func TestReplayOfARefusedAggregateCountsItsMembersOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b := setup(t, opts{simNow: now})
	testenv.CleanupKeys(t, b.rdb, consumer.DeadLetterStream(b.stream))
	at := now.Add(-time.Minute).Truncate(time.Second)
	e1, e2 := meterEvent(5, 1, at), meterEvent(5, 2, at.Add(300*time.Millisecond))
	b.addMeter(t, e1, e2)
	runConsumers(t, b.aggConsumer(t, "m-a", 3*time.Second))
	// Under -race beside the other packages (CI) a run of this test took
	// 22 s where it takes 10 s alone: the wait is the machine's, not the
	// sender's.
	testenv.Eventually(t, 90*time.Second, func() bool { return len(b.deadEntries(t)) == 2 }, "both members dead-lettered")
	if c := b.sim.MeterEventCounts(); c.Recorded != 0 {
		t.Fatalf("emulator counts %+v before the meter exists", c)
	}
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	done, err := consumer.ReplayDeadLetters(context.Background(), b.rdb, b.stream, consumer.ReasonMeterRefused, 0, false)
	if err != nil || len(done) != 2 {
		t.Fatalf("replayed %d: %v, want both members", len(done), err)
	}
	want := sums([]event.MeterEvent{e1, e2})
	testenv.Eventually(t, 90*time.Second, func() bool { return b.sim.MeterTotal(meterName, "cus_5") == want["cus_5"] },
		"the replayed members counted")
	l := b.meterLedger(t)
	for _, e := range []event.MeterEvent{e1, e2} {
		testenv.Eventually(t, 10*time.Second, func() bool {
			rec, err := l.Get(context.Background(), meterledger.KeyOf(e, e.Identifier("test")))
			return err == nil && rec.Status == meterledger.StatusDelivered
		}, "the member delivered")
	}
	b.assertMeterTotals(t, want)
}
