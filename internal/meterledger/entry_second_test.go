package meterledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// Every write of a row's stream entry id writes the second that entry was
// added (entry_second), which an aggregate's arrival bucket is read from:
// an ingest (the path of a customer-meter within its cap, and the exact
// path of one a cap left out), a replay of a parked event under a new
// entry, a per-event send and a repair's restore. An id of another form,
// or none, leaves it NULL (read from the id as before: the event's own
// second).
func TestEntrySecondIsTheSecondOfTheEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := t0.Add(-time.Hour)
	const ms = int64(1764500000123) // an entry id's milliseconds
	want := map[string]any{}        // identifier: entry_second (nil: NULL)

	fast := ingestReq(mev("cus_fast", "tokens", 1, at), "1764500000123-0")
	odd := ingestReq(mev("cus_fast", "tokens", 1, at.Add(time.Second)), "not-an-entry-id")
	none := ingestReq(mev("cus_fast", "tokens", 1, at.Add(2*time.Second)), "")
	if _, err := b.l.SetCap(ctx, meterledger.Cap{EventName: "tokens", StripeCustomerID: "cus_capped", Month: meterledger.AnyMonth, Cap: 10}); err != nil {
		t.Fatal(err)
	}
	exact := ingestReq(mev("cus_capped", "tokens", 6, at), "1764500001999-7")
	over := ingestReq(mev("cus_capped", "tokens", 6, at.Add(time.Second)), "1764500002000-0")
	out := b.ingest(t, fast, odd, none, exact, over)
	if out[3].Decision != meterledger.Queued || out[4].Decision != meterledger.OverCap {
		t.Fatalf("capped: %v then %v, want queued then over_cap (the exact path)", out[3].Decision, out[4].Decision)
	}
	want[fast.Identifier], want[odd.Identifier], want[none.Identifier], want[exact.Identifier] = ms/1000, nil, nil, (ms+1876)/1000

	// A per-event send, parked, then replayed from a new entry.
	sent := req(mev("cus_replayed", "tokens", 2, at), "a")
	sent.MessageID = "1764500003500-1"
	c := b.one(t, sent)
	if rec := b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: meterledger.Park, Reason: "parked by the test"}); !rec[0] {
		t.Fatal("parking the per-event send: not recorded")
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE identifier = $1 AND entry_second = $2`,
		sent.Identifier, (ms+3377)/1000); n != 1 {
		t.Fatalf("the per-event send's row has no entry_second of its entry (%d rows)", n)
	}
	replay := ingestReq(sent.Event, "1764500009000-0")
	replay.Identifier, replay.Replay = sent.Identifier, true
	if got := b.ingest(t, replay); got[0].Decision != meterledger.Queued {
		t.Fatalf("replaying the parked event: %v, want queued", got[0].Decision)
	}
	want[sent.Identifier] = (ms + 8877) / 1000

	lost := req(mev("cus_restored", "tokens", 3, at), "a")
	r := restored(lost, meterledger.StatusDelivered)
	r.MessageID = "1764500004000-2"
	if _, err := b.l.Restore(ctx, []meterledger.Restored{r}, true); err != nil {
		t.Fatal(err)
	}
	want[lost.Identifier] = (ms + 3877) / 1000

	rows, err := b.pool.Query(ctx, `SELECT identifier, entry_second FROM meter_events`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	var id string
	var sec *int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &sec}, func() error {
		got[id] = nil
		if sec != nil {
			got[id] = *sec
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: %v", len(got), len(want), got)
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			t.Errorf("row %s: entry_second %v, want %v", id, g, w)
		}
	}
}
