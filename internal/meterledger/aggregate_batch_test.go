package meterledger_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// A round's aggregates are formed and finished together: each customer-
// meter with a ready bucket gets its own aggregate of its oldest bucket's
// members (and says whether another is ready), one
// whose slot another holds gets nothing (and keeps that holder's slot);
// their outcomes are recorded together, each with its members, and an
// aggregate whose hold was lost gets none.
func TestAggregatesFormedAndFinishedInOneRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sec := t0.Add(-time.Minute)
	s := sec.Unix()
	var reqs []meterledger.IngestRequest
	for i, cust := range []string{"cus_a", "cus_b", "cus_c", "cus_d"} {
		// cus_a 1 event of value 1, cus_b 2 of 2, …
		reqs = append(reqs, eventsOfSecond(cust, sec, i, slices.Repeat([]int64{int64(i + 1)}, i+1)...)...)
	}
	// cus_a has another bucket ready, the next second.
	reqs = append(reqs, ingestReq(mev("cus_a", "tokens", 100, sec.Add(time.Second)), fmt.Sprintf("%d-0", (s+1)*1000)))
	b.ingest(t, reqs...)
	// cus_d's slot is held by another sender's per-event call.
	if _, err := b.pool.Exec(ctx, `INSERT INTO meter_inflight (stripe_customer_id, event_name, identifier, event_ts, owner, expires_at, token)
		VALUES ('cus_d', 'tokens', 'other', $1, 'other', $2, 7)`, sec, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	keys := []meterledger.MeterKey{{EventName: "tokens", StripeCustomerID: "cus_a"}, {EventName: "tokens", StripeCustomerID: "cus_b"},
		{EventName: "tokens", StripeCustomerID: "cus_c"}, {EventName: "tokens", StripeCustomerID: "cus_d"},
		{EventName: "tokens", StripeCustomerID: "cus_b"}, {EventName: "tokens", StripeCustomerID: "cus_none"}}
	formed, err := b.l.FormAggregates(ctx, meterledger.FormRequest{Namespace: "test", Stream: "usage", From: sec,
		Watermark: time.Unix(s+10, 0), Width: time.Second, Owner: "c", Lease: time.Minute}, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(formed) != 3 {
		t.Fatalf("formed %d aggregates, want 3 (cus_a, cus_b, cus_c): %+v", len(formed), formed)
	}
	for i, f := range formed {
		want := i + 1
		a := f.Aggregate
		if a.StripeCustomerID != keys[i].StripeCustomerID || !f.Send || a.Members != want || len(f.Members) != want ||
			a.Value != int64(want*want) || a.Epoch == 0 {
			t.Fatalf("aggregate %d: %s send %v, %d members (%d read), value %d, epoch %d; want %s, %d members, value %d",
				i, a.StripeCustomerID, f.Send, a.Members, len(f.Members), a.Value, a.Epoch, keys[i].StripeCustomerID, want, want*want)
		}
		if f.More != (i == 0) {
			t.Fatalf("aggregate of %s: More %v; only cus_a has another bucket ready", a.StripeCustomerID, f.More)
		}
		for _, m := range f.Members {
			if m.StripeCustomerID != a.StripeCustomerID {
				t.Fatalf("aggregate of %s has a member of %s", a.StripeCustomerID, m.StripeCustomerID)
			}
		}
		if a.Identifier != meterledger.AggregateIdentifier("test", "tokens", a.StripeCustomerID, sec, memberIDs(f.Members)) {
			t.Fatalf("aggregate of %s: identifier %s is not its members'", a.StripeCustomerID, a.Identifier)
		}
	}
	var slots int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM meter_inflight WHERE identifier LIKE 'pga_%' AND owner = 'c'`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	var other string
	if err := b.pool.QueryRow(ctx, `SELECT owner FROM meter_inflight WHERE stripe_customer_id = 'cus_d'`).Scan(&other); err != nil || slots != 3 || other != "other" {
		t.Fatalf("slots named by aggregates: %d (want 3); cus_d's held by %q (want other), %v", slots, other, err)
	}

	// cus_c's hold is lost (taken over by another epoch) before its outcome.
	lost := formed[2].Aggregate
	if _, err := b.pool.Exec(ctx, `UPDATE meter_aggregates SET epoch = epoch + 1 WHERE identifier = $1`, lost.Identifier); err != nil {
		t.Fatal(err)
	}
	res, err := b.l.FinishAggregates(ctx, []meterledger.AggregateOutcome{
		{Aggregate: formed[0].Aggregate, Result: meterledger.Delivered},
		{Aggregate: formed[1].Aggregate, Result: meterledger.Failed, Reason: "refused"},
		{Aggregate: lost, Result: meterledger.Delivered},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != meterledger.Delivered || res[1] != meterledger.Failed || res[2] != 0 {
		t.Fatalf("results %v, want delivered, failed, 0 (hold lost)", res)
	}
	members, err := b.l.MembersOfAll(ctx, []meterledger.Aggregate{formed[0].Aggregate, formed[1].Aggregate, lost})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []meterledger.Status{meterledger.StatusDelivered, meterledger.StatusFailed, meterledger.StatusSending} {
		ms := members[formed[i].Aggregate.Identifier]
		if len(ms) != i+1 {
			t.Fatalf("aggregate %d: %d members read, want %d", i, len(ms), i+1)
		}
		for _, m := range ms {
			if m.Status != want {
				t.Fatalf("aggregate %d: member %s is %s, want %s", i, m.Identifier, m.Status, want)
			}
		}
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM meter_inflight WHERE owner = 'c'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("slots still held after the round: %d, %v", slots, err)
	}
}

// eventsOfSecond are cust's tokens events of values, 100 ms apart from
// sec, their entries added in that second (sequence seq).
func eventsOfSecond(cust string, sec time.Time, seq int, values ...int64) []meterledger.IngestRequest {
	reqs := make([]meterledger.IngestRequest, len(values))
	for j, v := range values {
		reqs[j] = ingestReq(mev(cust, "tokens", v, sec.Add(time.Duration(j)*100*time.Millisecond)),
			fmt.Sprintf("%d-%d", sec.Unix()*1000+int64(j), seq))
	}
	return reqs
}

func memberIDs(ms []meterledger.Record) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.Identifier
	}
	return ids
}

// Members are read unlocked and moved by the predicate they were read by:
// one that another writer moves while the aggregate is formed (parked
// here), or a late event queued into the bucket meanwhile, makes the round
// form nothing (no aggregate saved, its slot free, the others still
// queued), and the next round forms the aggregate of what is queued then.
func TestAMemberMovedWhileFormingFormsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		meanwhile func(t *testing.T, b bundle, sec time.Time, moved string)
		queued    int
		members   int
		value     int64
	}{
		{name: "a member parked", queued: 2, members: 2, value: 1 + 3,
			meanwhile: func(t *testing.T, b bundle, _ time.Time, moved string) {
				if _, err := b.pool.Exec(context.Background(), `UPDATE meter_events SET status = 'parked', last_error = 'parked by hand'
					WHERE identifier = $1`, moved); err != nil {
					t.Error(err)
				}
			}},
		{name: "a late event queued", queued: 4, members: 4, value: 1 + 2 + 3 + 5,
			meanwhile: func(t *testing.T, b bundle, sec time.Time, _ string) {
				b.ingest(t, eventsOfSecond("cus_a", sec, 1, 5)...)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			sec := t0.Add(-time.Minute)
			s := sec.Unix()
			got := b.ingest(t, eventsOfSecond("cus_a", sec, 0, 1, 2, 3)...)
			once := false
			meterledger.SetMembersRead(b.l, func() {
				if !once {
					once = true
					tc.meanwhile(t, b, sec, got[1].Record.Identifier)
				}
			})
			fr := meterledger.FormRequest{Namespace: "test", Stream: "usage", From: sec, Watermark: time.Unix(s+10, 0), Width: time.Second,
				Owner: "c", Lease: time.Minute}
			keys := []meterledger.MeterKey{{EventName: "tokens", StripeCustomerID: "cus_a"}}
			formed, err := b.l.FormAggregates(ctx, fr, keys)
			if err != nil || len(formed) != 0 {
				t.Fatalf("formed %d aggregates (%v) while its members changed, want none", len(formed), err)
			}
			var aggs, slots, queued int
			if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM meter_aggregates), (SELECT count(*) FROM meter_inflight),
				(SELECT count(*) FROM meter_events WHERE status = 'queued')`).Scan(&aggs, &slots, &queued); err != nil {
				t.Fatal(err)
			}
			if aggs != 0 || slots != 0 || queued != tc.queued {
				t.Fatalf("after the round: %d aggregates, %d slots held, %d queued; want 0, 0 and %d", aggs, slots, queued, tc.queued)
			}
			formed, err = b.l.FormAggregates(ctx, fr, keys)
			if err != nil || len(formed) != 1 {
				t.Fatalf("next round: formed %d aggregates (%v), want 1", len(formed), err)
			}
			if a := formed[0].Aggregate; a.Members != tc.members || a.Value != tc.value {
				t.Fatalf("next round's aggregate: %d members, value %d; want %d, value %d", a.Members, a.Value, tc.members, tc.value)
			}
		})
	}
}
