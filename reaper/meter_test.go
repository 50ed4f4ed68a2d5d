package reaper_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

const testMeter = "api_requests"

// meterSetup is setup's world with a sum meter at the emulator; the bundle's
// stream is a meter-event stream.
func meterSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: testMeter}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) meterConfig(t *testing.T) reaper.Config {
	cfg := b.config(t, "reaper-m")
	cfg.Streams, cfg.Stripe = nil, nil
	cfg.MeterStreams = []reaper.StreamGroup{{Stream: b.stream, Group: b.group}}
	cfg.MeterStripe = b.stripe
	return cfg
}

func usage(cust, i int, at time.Time) event.MeterEvent {
	return event.MeterEvent{EventName: testMeter, StripeCustomerID: fmt.Sprintf("cus_%d", cust),
		Value: int64(1 + i%4), Timestamp: at.UTC().Truncate(time.Second), EventID: fmt.Sprintf("u-%d-%d", cust, i)}
}

func (b *bundle) addUsage(t *testing.T, evs ...event.MeterEvent) {
	t.Helper()
	for _, e := range evs {
		if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *bundle) meterLedger(t *testing.T) *meterledger.Ledger {
	t.Helper()
	l, err := meterledger.New(b.pool, meterledger.Config{Schema: testenv.SchemaOf(b.pool), Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePartitions(context.Background(), b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	return l
}

func (b *bundle) assertUsage(t *testing.T, evs []event.MeterEvent) {
	t.Helper()
	want := map[string]int64{}
	for _, e := range evs {
		want[e.StripeCustomerID] += e.Value
	}
	for cus, v := range want {
		if got := b.sim.MeterTotal(testMeter, cus); got != v {
			t.Errorf("%s: Stripe counts %d, the events add up to %d", cus, got, v)
		}
	}
}

// A consumer that died holding a batch of meter events, four per customer:
// the reaper claims them and sends each once, one call per customer and
// meter at a time (the emulator refuses a second call in flight).
func TestReaperRedrivesADeadMeterConsumersEvents(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	b.meterLedger(t)
	now := b.clk.Now()
	var evs []event.MeterEvent
	for i := range 12 {
		evs = append(evs, usage(i%3, i, now.Add(-time.Minute)))
	}
	b.addUsage(t, evs...)
	b.read(t, deadName, 100)
	b.waitIdle(t, len(evs), time.Millisecond)

	r := b.newReaper(t, b.meterConfig(t))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindClaim] != 12 || sum.Outcomes[consumer.OutcomeDelivered] != 12 {
		t.Fatalf("pass %+v: want 12 claimed and delivered", sum)
	}
	b.assertUsage(t, evs)
	if c := b.sim.MeterEventCounts(); c.Recorded != 12 || c.Concurrent != 0 {
		t.Fatalf("emulator counts %+v: want 12 recorded, none while another call of the customer's was in flight", c)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("%d entries still pending", len(p))
	}
}

// Entries whose events are delivered come back pending (an AOF rollback,
// a consumer killed between the ledger write and XACK): acked without a
// call.
func TestReaperAcksDeliveredMeterEventsWithoutACall(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	now := b.clk.Now()
	var evs []event.MeterEvent
	for i := range 6 {
		evs = append(evs, usage(i, i, now.Add(-time.Minute)))
	}
	b.addUsage(t, evs...)
	c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool),
		Stripe: b.stripe, Stream: b.stream, Group: b.group, Name: "m-1", Namespace: testNamespace, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	msgs := b.read(t, "m-1", 100)
	if got, err := c.ProcessBatch(context.Background(), msgs); err != nil || got.Delivered != 6 {
		t.Fatalf("first delivery %+v, %v", got, err)
	}
	// The acks are lost: the group's position goes back, the entries are
	// delivered again to a consumer that then dies.
	if err := b.rdb.XGroupSetID(context.Background(), b.stream, b.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	b.read(t, deadName, 100)
	b.waitIdle(t, 6, time.Millisecond)
	sum, err := b.newReaper(t, b.meterConfig(t)).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindAlreadyBilled] != 6 || sum.Decisions[reaper.KindClaim] != 0 {
		t.Fatalf("pass %+v: want 6 acked as delivered, none claimed", sum)
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != 6 || c.Duplicates != 0 {
		t.Fatalf("emulator counts %+v: want the 6 events once and no second call", c)
	}
	b.assertUsage(t, evs)
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("%d entries still pending", len(p))
	}
}

// An event in flight under a live lease is never claimed (reclaim while in
// flight); once the lease lapses it is re-sent under the same identifier,
// which Stripe still guards: counted once.
func TestReaperLeavesALiveMeterLeaseAlone(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	l := b.meterLedger(t)
	e := usage(1, 1, b.clk.Now().Add(-time.Minute))
	b.addUsage(t, e)
	msgs := b.read(t, deadName, 1)
	id := e.Identifier(testNamespace)
	claims, err := l.Reserve(context.Background(), []meterledger.Request{{Event: e, Identifier: id, Owner: "slow-consumer",
		Lease: time.Minute, MessageID: msgs[0].ID}})
	if err != nil || claims[0].Decision != meterledger.Acquired {
		t.Fatalf("reserve: %+v, %v", claims, err)
	}
	// The slow consumer's call reaches Stripe; its reply is still on its way.
	if _, err := b.stripe.SendMeterEvent(context.Background(), stripeapi.MeterEvent{EventName: e.EventName,
		StripeCustomerID: e.StripeCustomerID, Value: e.Value, Identifier: id, Timestamp: e.Timestamp}); err != nil {
		t.Fatal(err)
	}
	b.waitIdle(t, 1, time.Millisecond)
	r := b.newReaper(t, b.meterConfig(t))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindLeaseLive] != 1 || sum.Decisions[reaper.KindClaim] != 0 {
		t.Fatalf("pass %+v: want the live lease left alone", sum)
	}
	if len(b.pending(t)) != 1 {
		t.Fatal("the entry in flight is no longer pending")
	}
	// The slow consumer dies; its lease lapses.
	b.clk.Advance(2 * time.Minute)
	sum, err = r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Outcomes[consumer.OutcomeDelivered] != 1 {
		t.Fatalf("pass %+v: want the lapsed event re-sent and recorded delivered", sum)
	}
	// The re-send carries the identifier (and it as the idempotency key):
	// Stripe answers it without counting it again.
	if c := b.sim.MeterEventCounts(); c.Recorded != 1 {
		t.Fatalf("emulator counts %+v: want the event recorded once", c)
	}
	b.assertUsage(t, []event.MeterEvent{e})
	if rec, err := l.Get(context.Background(), meterledger.KeyOf(e, id)); err != nil || rec.Status != meterledger.StatusDelivered {
		t.Fatalf("ledger row %+v, %v: want delivered", rec, err)
	}
}

// An event whose outcome is unknown (the consumer died between Stripe's 200
// and the ledger write) and whose first attempt is older than the safe
// window: Stripe may have forgotten its identifier, so it is parked (dead
// letter and alert), never sent again.
func TestReaperParksAMeterEventOfUnknownOutcomePastTheWindow(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	l := b.meterLedger(t)
	e := usage(2, 2, b.clk.Now().Add(-time.Minute))
	b.addUsage(t, e)
	msgs := b.read(t, deadName, 1)
	id := e.Identifier(testNamespace)
	if _, err := l.Reserve(context.Background(), []meterledger.Request{{Event: e, Identifier: id, Owner: deadName,
		Lease: time.Second, MessageID: msgs[0].ID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.stripe.SendMeterEvent(context.Background(), stripeapi.MeterEvent{EventName: e.EventName,
		StripeCustomerID: e.StripeCustomerID, Value: e.Value, Identifier: id, Timestamp: e.Timestamp}); err != nil {
		t.Fatal(err)
	}
	// A day and an hour later (Stripe's window has passed: a re-send would
	// count again).
	b.clk.Advance(25 * time.Hour)
	b.sim.Advance(25 * time.Hour)
	b.waitIdle(t, 1, time.Millisecond)
	sum, err := b.newReaper(t, b.meterConfig(t)).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Outcomes[consumer.OutcomeParked] != 1 {
		t.Fatalf("pass %+v: want the event parked", sum)
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != 1 {
		t.Fatalf("emulator counts %+v: the parked event was sent again", c)
	}
	b.assertUsage(t, []event.MeterEvent{e})
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Values["reason"] != consumer.ReasonMeterParked {
		t.Fatalf("dead letters %v: want one %s", dl, consumer.ReasonMeterParked)
	}
	if n := len(b.notifier.Alerts()); n != 1 {
		t.Fatalf("%d alerts, want 1 (meter_event_parked)", n)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("%d entries still pending", len(p))
	}
}

// --dry-run decides and changes nothing.
func TestReaperMeterDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	b.meterLedger(t)
	b.addUsage(t, usage(3, 1, b.clk.Now().Add(-time.Minute)), usage(3, 2, b.clk.Now().Add(-time.Minute)))
	b.read(t, deadName, 10)
	b.waitIdle(t, 2, time.Millisecond)
	cfg := b.meterConfig(t)
	cfg.DryRun, cfg.MeterStripe = true, nil
	sum, err := b.newReaper(t, cfg).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindClaim] != 2 {
		t.Fatalf("pass %+v: want 2 claims decided", sum)
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != 0 {
		t.Fatalf("a dry run sent %d events", c.Recorded)
	}
	if p := b.pending(t); len(p) != 2 || p[0].Consumer != deadName {
		t.Fatalf("pending %+v: want both left with %s", p, deadName)
	}
}

// Explain on a meter stream decides each entry as a dry-run pass does,
// from the same ledger and clock, and changes nothing.
func TestExplainMeterStreamDecidesAsADryRunPass(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	l := b.meterLedger(t)
	ctx := context.Background()
	now := b.clk.Now()
	delivered, live, fresh := usage(5, 1, now.Add(-time.Minute)), usage(5, 2, now.Add(-time.Minute)), usage(6, 3, now.Add(-time.Minute))
	b.addUsage(t, delivered, live, fresh)
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"event_name":"api_requests","value":"x"}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	msgs := b.read(t, deadName, 10)
	for _, x := range []struct {
		e     event.MeterEvent
		owner string
		lease time.Duration
	}{{delivered, deadName, time.Second}, {live, "slow-consumer", time.Hour}} {
		claims, err := l.Reserve(ctx, []meterledger.Request{{Event: x.e, Identifier: x.e.Identifier(testNamespace), Owner: x.owner, Lease: x.lease}})
		if err != nil || !claims[0].Decision.MaySend() {
			t.Fatalf("reserve: %+v %v", claims, err)
		}
		if x.e == delivered {
			if _, err := l.Finish(ctx, []meterledger.Outcome{{Hold: claims[0].Hold(), Result: meterledger.Delivered}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	b.waitIdle(t, len(msgs), time.Millisecond)
	cfg := b.meterConfig(t)
	cfg.DryRun, cfg.MeterStripe = true, nil
	r := b.newReaper(t, cfg)
	pend := b.pending(t)
	xs, err := r.Explain(ctx, b.stream, pend)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	pass := map[string]reaper.Kind{}
	b.mu.Lock()
	for _, d := range b.decisions {
		pass[d.ID] = d.Kind
	}
	b.mu.Unlock()
	want := []reaper.Kind{reaper.KindAlreadyBilled, reaper.KindLeaseLive, reaper.KindClaim, reaper.KindInvalid}
	for i, x := range xs {
		if x.Decision.Kind != want[i] || pass[x.Decision.ID] != x.Decision.Kind {
			t.Errorf("entry %d (%s): explained %s, the dry-run pass %s, want %s", i, x.Decision.ID, x.Decision.Kind, pass[x.Decision.ID], want[i])
		}
	}
	if row := xs[0].Row; row == nil || row.Meter != testMeter || row.Units != delivered.Value || row.Status != "delivered" {
		t.Errorf("the delivered entry's row %+v", row)
	}
	if after := b.pending(t); len(after) != len(pend) {
		t.Errorf("%d pending after Explain and a dry run, %d before", len(after), len(pend))
	}
}

// TestReaperMeterDeadLettersAlert: what the reaper dead-letters on a meter
// stream (here a malformed event a dead consumer left pending) raises the
// consumers' dead_letters alert for the stream, not only a metric.
func TestReaperMeterDeadLettersAlert(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	ctx := context.Background()
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": "not json"}}).Err(); err != nil {
		t.Fatal(err)
	}
	b.read(t, deadName, 1)
	b.waitIdle(t, 1, time.Millisecond)
	mem := alerts.NewMemory()
	dl := alerts.NewDeadLetterAggregator(mem, time.Hour, b.clk)
	t.Cleanup(func() { _ = dl.Stop(context.Background()) })
	cfg := b.meterConfig(t)
	cfg.DeadLetters = dl
	if _, err := b.newReaper(t, cfg).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.deadLetters(t); len(got) != 1 {
		t.Fatalf("dead letters %v: want the malformed event", got)
	}
	if n := dl.Flush(); n != 1 {
		t.Fatalf("flushed %d alerts, want one", n)
	}
	as := mem.Alerts()
	if len(as) != 1 || as[0].Kind != alerts.KindDeadLetters || !strings.Contains(as[0].Title, "1 event dead-lettered on "+b.stream) {
		t.Fatalf("alerts %+v: want one dead_letters for %s", as, b.stream)
	}
}

// An entry left pending by a dead consumer whose event the usage repair
// parked (a ledger rollback lost its row, past the safe window) is claimed
// and dead-lettered with the repair's reason, so that a person can settle
// it and replay it; nothing is sent, and no alert beyond the repair's.
func TestReaperDeadLettersAMeterEventTheRepairParked(t *testing.T) {
	t.Parallel()
	b := meterSetup(t)
	l := b.meterLedger(t)
	ctx := context.Background()
	e := usage(3, 1, b.clk.Now().Add(-25*time.Hour))
	b.addUsage(t, e)
	msgs := b.read(t, deadName, 1)
	if _, err := l.EnsurePartitions(ctx, b.clk.Now()); err != nil {
		t.Fatal(err)
	}
	reason := "the ledger lost rows in a rollback and this entry was not acked: not re-sent"
	if res, err := l.Restore(ctx, []meterledger.Restored{{Key: meterledger.KeyOf(e, e.Identifier(testNamespace)),
		EventName: e.EventName, StripeCustomerID: e.StripeCustomerID, Value: e.Value, Status: meterledger.StatusParked,
		MessageID: msgs[0].ID, Reason: reason}}, false); err != nil || res[0].Outcome != meterledger.RestoreInserted {
		t.Fatalf("restoring the parked row: %+v %v", res, err)
	}
	b.waitIdle(t, 1, time.Millisecond)
	sum, err := b.newReaper(t, b.meterConfig(t)).RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Outcomes[consumer.OutcomeParked] != 1 {
		t.Fatalf("pass %+v: want the entry dead-lettered as parked", sum)
	}
	if c := b.sim.MeterEventCounts(); c.Recorded != 0 {
		t.Fatalf("emulator counts %+v: a parked event was sent", c)
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Values["reason"] != consumer.ReasonMeterParked || dl[0].Values["detail"] != reason {
		t.Fatalf("dead letters %v: want one %s with the repair's reason", dl, consumer.ReasonMeterParked)
	}
	if n := len(b.notifier.Alerts()); n != 0 {
		t.Fatalf("%d alerts: the repair's report named the event already", n)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("%d entries still pending", len(p))
	}
}
