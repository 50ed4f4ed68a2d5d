package meterledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
)

func ingestReq(ev event.MeterEvent, msg string) meterledger.IngestRequest {
	r := req(ev, "ingest")
	r.MessageID = msg
	return meterledger.IngestRequest{Request: r, Stream: "usage", Fields: map[string]any{"payload": ev.Payload()}}
}

func (b bundle) ingest(t *testing.T, reqs ...meterledger.IngestRequest) []meterledger.Ingested {
	t.Helper()
	out, err := b.l.Ingest(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An event is recorded once, queued, its use counted once and its cap
// decided at ingest; a redelivery finds its row; the sender's Unsent gives
// one event per customer-meter, and Reserve sends it from the ledger under
// the same identifier.
func TestIngestRecordsOnceAndSendsFromTheLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.l.SetCap(ctx, meterledger.Cap{EventName: "tokens", StripeCustomerID: "cus_capped", Month: meterledger.AnyMonth, Cap: 10}); err != nil {
		t.Fatal(err)
	}
	busy := []meterledger.IngestRequest{}
	for i := range 5 {
		busy = append(busy, ingestReq(mev("cus_busy", "tokens", 2, t0.Add(-time.Duration(i)*time.Second)), "1-"+string(rune('0'+i))))
	}
	quiet := ingestReq(mev("cus_quiet", "tokens", 3, t0.Add(-10*time.Second)), "2-0")
	capped := []meterledger.IngestRequest{ingestReq(mev("cus_capped", "tokens", 6, t0.Add(-3*time.Second)), "3-0"),
		ingestReq(mev("cus_capped", "tokens", 6, t0.Add(-2*time.Second)), "3-1")}
	all := append(append(append([]meterledger.IngestRequest{}, busy...), quiet), capped...)
	all = append(all, busy[0]) // a copy in the same batch
	out := b.ingest(t, all...)
	for i := range 6 {
		if out[i].Decision != meterledger.Queued || out[i].Record.Status != meterledger.StatusQueued || !out[i].Ack() {
			t.Fatalf("event %d: %v %s, want queued", i, out[i].Decision, out[i].Record.Status)
		}
	}
	if out[6].Decision != meterledger.Queued || out[7].Decision != meterledger.OverCap || out[7].Ack() {
		t.Fatalf("capped: %v then %v, want queued then over_cap", out[6].Decision, out[7].Decision)
	}
	if out[8].Decision != meterledger.InLedger {
		t.Fatalf("a copy in the batch: %v, want in_ledger", out[8].Decision)
	}
	// A redelivery: in the ledger, nothing counted twice.
	again := b.ingest(t, all...)
	for i, g := range again {
		if want := meterledger.InLedger; i != 7 && g.Decision != want {
			t.Fatalf("redelivery %d: %v, want %v", i, g.Decision, want)
		}
	}
	us, err := b.l.Usage(ctx, "tokens", "cus_busy", meterledger.MonthOf(t0))
	if err != nil || len(us) != 1 || us[0].Units != 10 || us[0].Events != 5 {
		t.Fatalf("busy's use %+v (%v), want 10 units of 5 events", us, err)
	}
	// One candidate per customer-meter, the oldest first.
	cands, err := b.l.Unsent(ctx, "usage", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 3 || cands[0].StripeCustomerID != "cus_quiet" {
		t.Fatalf("candidates %d (first %s), want 3, cus_quiet first", len(cands), cands[0].StripeCustomerID)
	}
	var reqs []meterledger.Request
	for _, r := range cands {
		if meterledger.FieldsOf(r)["payload"] == nil {
			t.Fatalf("row %s lost its entry's fields", r.Key)
		}
		reqs = append(reqs, meterledger.Request{Event: meterledger.EventOf(r), Identifier: r.Identifier, Owner: "sender",
			Lease: 30 * time.Second, MessageID: r.StreamMessageID})
	}
	claims := b.reserve(t, reqs...)
	var outs []meterledger.Outcome
	for i, c := range claims {
		if c.Decision != meterledger.Acquired || c.Record.Status != meterledger.StatusSending || c.Record.Identifier != cands[i].Identifier {
			t.Fatalf("claim %d: %v %s, want acquired sending", i, c.Decision, c.Record.Status)
		}
		outs = append(outs, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Delivered})
	}
	// While they are in flight, those customer-meters offer nothing more.
	if more, err := b.l.Unsent(ctx, "usage", 100); err != nil || len(more) != 0 {
		t.Fatalf("candidates while in flight: %d (%v), want 0", len(more), err)
	}
	if _, err := b.l.Finish(ctx, outs); err != nil {
		t.Fatal(err)
	}
	q, s, err := b.l.Backlog(ctx, "usage")
	if err != nil || q != 4 || s != 0 {
		t.Fatalf("backlog %d queued %d sending (%v), want 4 and 0", q, s, err)
	}
	// Use is not counted again at the send.
	if us, _ := b.l.Usage(ctx, "tokens", "cus_busy", meterledger.MonthOf(t0)); us[0].Units != 10 {
		t.Fatalf("busy's use after a send: %d, want 10", us[0].Units)
	}
}

// Once the ledger sends from ingest, a per-event reservation of a new event
// is refused (the rollout's fence), while a row already sending finishes.
func TestPerEventSendsAreFencedOnceIngestStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := b.one(t, req(mev("cus_a", "tokens", 1, t0.Add(-time.Minute)), "old"))
	if old.Decision != meterledger.Acquired {
		t.Fatalf("before the fence: %v", old.Decision)
	}
	if err := b.l.FenceSends(ctx, "new-consumer"); err != nil {
		t.Fatal(err)
	}
	if fenced, _, err := b.l.SendsFenced(ctx); err != nil || !fenced {
		t.Fatalf("fenced %v (%v)", fenced, err)
	}
	_, err := b.l.Reserve(ctx, []meterledger.Request{req(mev("cus_b", "tokens", 1, t0.Add(-time.Minute)), "old")})
	if !meterledger.IsPerEventFenced(err) {
		t.Fatalf("a per-event reservation after the fence: %v, want the fence's refusal", err)
	}
	rec, err := b.l.Finish(ctx, []meterledger.Outcome{{Hold: old.Hold(), Result: meterledger.Delivered}})
	if err != nil || !rec[0] {
		t.Fatalf("the row sending before the fence did not finish: %v %v", rec, err)
	}
	// Ingest still records.
	if out := b.ingest(t, ingestReq(mev("cus_b", "tokens", 1, t0.Add(-time.Minute)), "9-0")); out[0].Decision != meterledger.Queued {
		t.Fatalf("ingest after the fence: %v", out[0].Decision)
	}
}

// An aggregate the ledger lost with its members (a rollback), restored
// from its witness: the members come back sending under it, the aggregate
// sending of unknown outcome, and a sender takes it over as the same call
// (same identifier, same value) — never its members on their own.
func TestALostAggregateIsRestoredAsTheSameCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sec := t0.Add(-time.Minute)
	evs := []meterledger.IngestRequest{ingestReq(mev("cus_a", "tokens", 2, sec), "1-0"),
		ingestReq(mev("cus_a", "tokens", 5, sec.Add(300*time.Millisecond)), "1-1")}
	b.ingest(t, evs...)
	a, members, ok, err := b.l.FormAggregate(ctx, "test", "usage", "tokens", "cus_a", sec.Add(time.Second), time.Second, "dead", time.Second)
	if err != nil || !ok || len(members) != 2 || a.Value != 7 {
		t.Fatalf("forming: ok %v, %d members, value %d (%v)", ok, len(members), a.Value, err)
	}
	// The rollback loses the aggregate and its members.
	if _, err := b.pool.Exec(ctx, `DELETE FROM meter_aggregates`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM meter_events`); err != nil {
		t.Fatal(err)
	}
	var rs []meterledger.Restored
	for _, m := range members {
		rs = append(rs, meterledger.Restored{Key: m.Key, EventName: m.EventName, StripeCustomerID: m.StripeCustomerID, Value: m.Value,
			Status: meterledger.StatusQueued, FirstSentAt: m.CreatedAt, Stream: "usage", Aggregate: a.Identifier})
	}
	if _, err := b.l.Restore(ctx, rs, true); err != nil {
		t.Fatal(err)
	}
	if more, err := b.l.Unsent(ctx, "usage", 10); err != nil || len(more) != 0 {
		t.Fatalf("the restored members are offered on their own: %d (%v)", len(more), err)
	}
	if ok, err := b.l.RestoreAggregate(ctx, a); err != nil || !ok {
		t.Fatalf("restoring the aggregate: %v %v", ok, err)
	}
	b.clk.Advance(2 * time.Second)
	stale, err := b.l.StaleAggregates(ctx, "usage", 10)
	if err != nil || len(stale) != 1 {
		t.Fatalf("stale aggregates %d (%v), want the restored one", len(stale), err)
	}
	d, got, _, err := b.l.TakeOverAggregate(ctx, stale[0], "live", time.Minute)
	if err != nil || d != meterledger.TakenOver || got.Identifier != a.Identifier || got.Value != 7 || got.Digest != a.Digest {
		t.Fatalf("takeover: %v %s value %d (%v), want the same call (%s, 7)", d, got.Identifier, got.Value, err, a.Identifier)
	}
	if res, err := b.l.FinishAggregate(ctx, got, meterledger.Delivered, ""); err != nil || res != meterledger.Delivered {
		t.Fatalf("finish: %v %v", res, err)
	}
	ms, err := b.l.Members(ctx, a.Identifier)
	if err != nil || len(ms) != 2 || ms[0].Status != meterledger.StatusDelivered || ms[1].Status != meterledger.StatusDelivered {
		t.Fatalf("members after the re-send: %+v (%v)", ms, err)
	}
}
