package repair_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// The usage repair's count of events "left to be sent again" holds only
// the entries that may have been sent before the loss: of four entries not
// acked whose rows are missing — two added before the loss was found, one
// added after it and read, one added after it and unread — two are
// left to be sent again and two are counted as added after the loss, never
// sent before it. Nothing is parked (all are within the safe window), a
// row the ledger has is left alone, and a repair without the time the loss
// was found counts all four as before.
func TestUsageRepairCountsOnlyEntriesThatMayHaveBeenSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC()
	ts := now.Add(-10 * time.Minute).Truncate(time.Second)
	evOf := func(i int) event.MeterEvent {
		return event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_%d", i), Value: int64(i), Timestamp: ts,
			EventID: fmt.Sprintf("e%d", i)}
	}
	known := evOf(9) // delivered: the witness holds it
	ml, rdb, ws := usageRepairWorld(t, "repair-usage", known, now)
	stream := ws.Stream
	found := now.Add(-time.Minute) // the loss was found a minute ago
	add := func(at time.Time, e event.MeterEvent) string {
		t.Helper()
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("%d-0", at.UnixMilli()),
			Values: map[string]any{event.PayloadField: e.Payload()}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	add(found.Add(-3*time.Minute), evOf(1)) // read before the loss was found, not acked
	add(found.Add(-2*time.Minute), evOf(9)) // the witnessed one, re-read: its row comes back
	add(found.Add(-time.Minute), evOf(2))   // unread, before
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "meters", Consumer: "c1", Streams: []string{stream, ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	add(found.Add(20*time.Second), evOf(3)) // after, read
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "meters", Consumer: "c1", Streams: []string{stream, ">"}, Count: 10}).Err(); err != nil {
		t.Fatal(err)
	}
	add(found.Add(30*time.Second), evOf(4)) // after, unread

	rep, err := repair.Usage(ctx, repair.UsageConfig{Ledger: ml, Redis: rdb, Since: now.Add(-time.Hour), Until: found, By: "test",
		Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resend != 2 || rep.New != 2 || rep.Parked != 0 || rep.Restored != 1 {
		t.Fatalf("report %+v: want 2 left to be sent again (added before the loss was found), 2 added after it, 1 restored, none parked", rep)
	}
	if !strings.Contains(rep.Notes[0], "2 left to be sent again under their identifiers (their entries may have been sent before the loss), "+
		"2 added after the loss was found and never sent before it") {
		t.Errorf("the report's first line says %q", rep.Notes[0])
	}
	_, has, err := ml.Lookup(ctx, []meterledger.Key{meterledger.KeyOf(evOf(1), evOf(1).Identifier(ws.Namespace))})
	if err != nil || has[0] {
		t.Fatalf("the repair wrote a row for an event to be sent again (found %v, %v): it leaves them to the consumers", has, err)
	}
	again, err := repair.Usage(ctx, repair.UsageConfig{Ledger: ml, Redis: rdb, Since: now.Add(-time.Hour), By: "test"})
	if err != nil || again.Resend != 4 || again.New != 0 {
		t.Fatalf("without the time the loss was found: %+v %v, want all four left to be sent again", again, err)
	}
}

// An entry not acked whose row is missing and that is past the safe window
// is parked with the event's own time as its first attempt (the real one is
// unknown): a replay of it is then refused until a person settles it, as
// Stripe may count it; never sent meanwhile.
func TestUsageRepairParksWithTheEventsTimeAsItsFirstAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC()
	ts := now.Add(-30 * time.Hour).Truncate(time.Second)
	ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_p", Value: 5, Timestamp: ts, EventID: "p1"}
	other := ev // delivered: the witness holds it
	other.EventID, other.StripeCustomerID = "p0", "cus_o"
	ml, rdb, ws := usageRepairWorld(t, "repair-park", other, now)
	if _, err := ml.EnsurePartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: ws.Stream, Values: map[string]any{event.PayloadField: ev.Payload()}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := repair.Usage(ctx, repair.UsageConfig{Ledger: ml, Redis: rdb, Since: now.Add(-time.Hour), Until: now, By: "test",
		Logger: testenv.Logger(t)})
	if err != nil || rep.Parked != 1 {
		t.Fatalf("report %+v %v: want the unacked entry past the safe window parked", rep, err)
	}
	key := meterledger.KeyOf(ev, ev.Identifier(ws.Namespace))
	rec, err := ml.Get(ctx, key)
	if err != nil || rec.Status != meterledger.StatusParked || !rec.FirstSentAt.Equal(ts) || !strings.Contains(rec.LastError, "meter-settle") {
		t.Fatalf("row %+v %v: want parked, first attempt at the event's time %s, and a reason naming meter-settle", rec, err, ts)
	}
	claims, err := ml.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: ev.Identifier(ws.Namespace), Owner: "replayer",
		Lease: time.Minute, MessageID: id, Replay: true}})
	if err != nil || claims[0].Decision != meterledger.ReplayRefused {
		t.Fatalf("a replay of it: %+v %v; want it refused until settled", claims, err)
	}
}

// usageRepairWorld is a meter ledger and a stream (group "meters") that
// the meter witness has registered by holding known, delivered.
func usageRepairWorld(t *testing.T, namespace string, known event.MeterEvent, now time.Time) (*meterledger.Ledger, *redis.Client,
	meterwitness.Stream) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	rdb := testenv.Redis(t)
	ml, err := meterledger.New(pool, meterledger.Config{Schema: testenv.SchemaOf(pool)})
	if err != nil {
		t.Fatal(err)
	}
	ledgerID, err := ml.LedgerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream := testenv.Name(t, "usage")
	ws := meterwitness.Stream{Stream: stream, Group: "meters", Namespace: namespace}
	testenv.CleanupKeys(t, rdb, stream, meterwitness.Key(stream, "meters"), meterwitness.RegistryKey(ledgerID))
	if err := meterwitness.Record(ctx, rdb, ledgerID, ws, []meterwitness.Sent{{Status: meterwitness.Delivered, EventTS: known.Timestamp,
		Identifier: known.Identifier(namespace), EventName: known.EventName, StripeCustomerID: known.StripeCustomerID,
		Value: known.Value, FirstSentAt: known.Timestamp}}, now, false); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreateMkStream(ctx, stream, "meters", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return ml, rdb, ws
}
