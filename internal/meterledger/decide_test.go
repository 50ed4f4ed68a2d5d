package meterledger

import (
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func testReq(cust, meter string, value int64, ts time.Time) Request {
	ev := event.MeterEvent{EventName: meter, StripeCustomerID: cust, Value: value, Timestamp: ts}
	return Request{Event: ev, Identifier: ev.Identifier("test"), Owner: "A", Lease: 30 * time.Second}
}

// The row decision, as a table: every state a row can be in, at the times
// that matter (the lease, the safe window, Stripe's 35 days), and suspect.
func TestDecideRow(t *testing.T) {
	t.Parallel()
	const safe = 23 * time.Hour
	r := testReq("cus_1", "api", 3, t0)
	key := KeyOf(r.Event, r.Identifier)
	row := func(mod func(*Record)) *Record {
		rec := Record{Key: key, EventName: "api", StripeCustomerID: "cus_1", Value: 3, Status: StatusSending,
			FirstSentAt: t0, Attempts: 1, Epoch: 1}
		mod(&rec)
		return &rec
	}
	live := func(r *Record) { r.LeaseOwner, r.LeaseExpiresAt = "B", t0.Add(time.Hour) }
	dead := func(r *Record) { r.LeaseOwner, r.LeaseExpiresAt = "B", t0.Add(30*time.Second) }
	released := func(*Record) {}
	suspect := r
	suspect.Suspect = true
	other := r
	other.Event.Value = 4
	replay := r
	replay.Replay = true
	fixed := other
	fixed.Replay = true
	overridden := replay
	overridden.Override = "not at Stripe (by alice at 2026-12-01T06:00:00Z)"
	cases := []struct {
		name   string
		now    time.Time
		req    Request
		row    *Record
		want   Decision
		reason string
	}{
		{"new", t0.Add(time.Minute), r, nil, Acquired, ""},
		{"new, 34 days old", t0.Add(34 * 24 * time.Hour), r, nil, Acquired, ""},
		{"new, past 35 days", t0.Add(35*24*time.Hour + time.Second), r, nil, OutsideWindow, "outside what Stripe takes"},
		{"new, 6 minutes ahead", t0.Add(-6 * time.Minute), r, nil, OutsideWindow, "outside what Stripe takes"},
		{"new, suspect, recent", t0.Add(22 * time.Hour), suspect, nil, Acquired, ""},
		{"new, suspect, past the safe window", t0.Add(23 * time.Hour), suspect, nil, Held, "until the rollback is repaired"},
		{"delivered", t0.Add(time.Minute), r, row(func(r *Record) { r.Status = StatusDelivered }), AlreadyDelivered, ""},
		{"delivered, 35 days on", t0.Add(35 * 24 * time.Hour), r, row(func(r *Record) { r.Status = StatusDelivered }), AlreadyDelivered, ""},
		{"delivered, suspect", t0.Add(30 * time.Hour), suspect, row(func(r *Record) { r.Status = StatusDelivered }), AlreadyDelivered, ""},
		{"parked", t0.Add(time.Minute), r, row(func(r *Record) { r.Status, r.LastError = StatusParked, "why" }), AlreadyTerminal, "why"},
		{"failed", t0.Add(time.Minute), r, row(func(r *Record) { r.Status, r.LastError = StatusFailed, "no meter" }), AlreadyTerminal, "no meter"},
		{"another value, same identifier", t0.Add(time.Minute), other, row(func(r *Record) { r.Status = StatusDelivered }), Conflict, "value 3"},
		{"replay of a failed event", t0.Add(time.Minute), replay, row(func(r *Record) { r.Status, r.LastError = StatusFailed, "no meter" }), Reopened, ""},
		// A parked event may be at Stripe: past the safe window of its first
		// attempt only the operator's override reopens it.
		{"replay of a parked event", t0.Add(30 * time.Hour), overridden, row(func(r *Record) { r.Status, r.LastError = StatusParked, "why" }), Reopened, ""},
		{"replay of a parked event, no override", t0.Add(30 * time.Hour), replay, row(func(r *Record) { r.Status, r.LastError = StatusParked, "why" }),
			ReplayRefused, "could count it twice"},
		{"replay of a parked event inside the safe window", t0.Add(time.Hour), replay, row(func(r *Record) { r.Status, r.LastError = StatusParked, "why" }), Reopened, ""},
		{"replay of a failed event after an unknown outcome", t0.Add(30 * time.Hour), replay,
			row(func(r *Record) { r.Status, r.LastError, r.OutcomeUnknown, r.Attempts = StatusFailed, "401", true, 2 }), ReplayRefused, "could count it twice"},
		{"replay of a settled one", t0.Add(30 * time.Hour), replay,
			row(func(r *Record) {
				r.Status, r.LastError, r.OutcomeUnknown, r.SettledAt = StatusFailed, "settled", true, t0.Add(29*time.Hour)
			}), Reopened, ""},
		{"replay, fixed value, of a failed event", t0.Add(time.Minute), fixed, row(func(r *Record) { r.Status, r.LastError = StatusFailed, "bad" }), Reopened, ""},
		{"replay of a delivered event", t0.Add(time.Minute), replay, row(func(r *Record) { r.Status = StatusDelivered }), AlreadyDelivered, ""},
		{"replay of a failed event past 35 days", t0.Add(36 * 24 * time.Hour), replay, row(func(r *Record) { r.Status, r.LastError = StatusFailed, "x" }), AlreadyTerminal, "x"},
		{"live lease", t0.Add(time.Minute), r, row(live), Busy, "leased by B"},
		{"live lease, our own name", t0.Add(time.Minute), r, row(func(r *Record) { live(r); r.LeaseOwner = "A" }), Busy, "leased by A"},
		{"lease expired", t0.Add(time.Minute), r, row(dead), TakenOver, ""},
		{"released", t0.Add(time.Minute), r, row(released), TakenOver, ""},
		{"released, just inside the window", t0.Add(safe - time.Second), r, row(released), TakenOver, ""},
		{"released, at the window", t0.Add(safe), r, row(released), Parked, "older than Stripe's identifier window"},
		{"expired, a day on", t0.Add(25 * time.Hour), r, row(dead), Parked, "older than Stripe's identifier window"},
		{"taken over late, first attempt recent", t0.Add(30 * time.Hour), r,
			row(func(r *Record) { r.FirstSentAt = t0.Add(29 * time.Hour) }), TakenOver, ""},
		{"released, past 35 days", t0.Add(36 * 24 * time.Hour), r, row(func(r *Record) { r.FirstSentAt = t0.Add(36*24*time.Hour - time.Hour) }),
			Parked, "past Stripe's 35 days"},
	}
	for _, c := range cases {
		got, reason := decideRow(c.now, safe, c.req, key, c.row)
		if got != c.want || !strings.Contains(reason, c.reason) {
			t.Errorf("%s: %v %q, want %v %q", c.name, got, reason, c.want, c.reason)
		}
	}
}

// The slot plan: one send per customer and meter per batch, takeovers
// first, then the oldest; a live slot of another event blocks, an expired
// one or the same event's stale one does not; copies follow the first.
func TestPlan(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Hour)
	mk := func(i int, r Request, d Decision, s slot) *item {
		it := &item{i: i, req: r, key: KeyOf(r.Event, r.Identifier), slot: s}
		it.claim.Decision = d
		return it
	}
	a1 := testReq("cus_1", "api", 1, t0.Add(2*time.Second))
	a2 := testReq("cus_1", "api", 2, t0.Add(time.Second))
	a3 := testReq("cus_1", "api", 3, t0)
	b1 := testReq("cus_1", "tokens", 1, t0)
	c1 := testReq("cus_2", "api", 1, t0)
	d1 := testReq("cus_3", "api", 1, t0)
	e1 := testReq("cus_4", "api", 1, t0)
	liveOther := slot{Identifier: "pg_other", ExpiresAt: now.Add(time.Second), Token: 7}
	expiredOther := slot{Identifier: "pg_other", ExpiresAt: now, Token: 8}
	staleOwn := slot{Identifier: d1.Identifier, ExpiresAt: now.Add(time.Minute), Token: 9}
	items := []*item{
		mk(0, a1, Acquired, slot{}),
		mk(1, a2, Acquired, slot{}),
		mk(2, a3, TakenOver, slot{}), // newest by priority: takeovers first
		mk(3, b1, Acquired, slot{}),  // another meter of the same customer
		mk(4, c1, Acquired, liveOther),
		mk(5, a1, Acquired, slot{}), // a copy of item 0
		mk(6, d1, TakenOver, staleOwn),
		mk(7, e1, Acquired, expiredOther),
	}
	var tok int64
	plan(now, items, func() int64 { tok++; return tok })
	want := []struct {
		d  Decision
		op op
	}{{SlotBusy, opNone}, {SlotBusy, opNone}, {TakenOver, opTakeOver}, {Acquired, opInsert}, {SlotBusy, opNone},
		{SlotBusy, opNone}, {TakenOver, opTakeOver}, {Acquired, opInsert}}
	for i, w := range want {
		if it := items[i]; it.claim.Decision != w.d || it.op != w.op || (w.op != opNone) != (it.newTok != 0) {
			t.Errorf("item %d: %v op %d token %d, want %v op %d", i, it.claim.Decision, it.op, it.newTok, w.d, w.op)
		}
	}
	if !strings.Contains(items[4].claim.Reason, "pg_other") || !strings.Contains(items[0].claim.Reason, "another event of this batch") {
		t.Errorf("reasons: %q / %q", items[4].claim.Reason, items[0].claim.Reason)
	}

	// A copy of a sending event is Busy; ended events free their own stale
	// slot, not another event's, and not one a send of the batch takes.
	f1 := testReq("cus_5", "api", 1, t0)
	g1 := testReq("cus_6", "api", 1, t0)
	h1 := testReq("cus_7", "api", 1, t0)
	h2 := testReq("cus_7", "api", 2, t0)
	own := func(r Request, tok int64) slot { return slot{Identifier: r.Identifier, ExpiresAt: now, Token: tok} }
	items = []*item{
		mk(0, f1, Acquired, slot{}), mk(1, f1, Acquired, slot{}),
		mk(2, g1, AlreadyDelivered, own(g1, 11)),
		mk(3, h1, Parked, own(h1, 12)), mk(4, h2, Acquired, own(h1, 12)),
		mk(5, g1, AlreadyDelivered, own(g1, 11)),
	}
	plan(now, items, func() int64 { tok++; return tok })
	if items[1].claim.Decision != Busy || items[1].op != opNone {
		t.Errorf("copy of a send: %v op %d", items[1].claim.Decision, items[1].op)
	}
	if items[2].op != opFree || items[2].freeTok != 11 || items[5].op != opNone {
		t.Errorf("delivered with a stale slot: op %d free %d; its copy op %d", items[2].op, items[2].freeTok, items[5].op)
	}
	if items[4].op != opInsert || items[3].op != opPark || items[3].freeTok != 0 {
		t.Errorf("a park whose expired slot a send takes: send op %d, park op %d free %d", items[4].op, items[3].op, items[3].freeTok)
	}
}
