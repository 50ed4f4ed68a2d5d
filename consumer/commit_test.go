package consumer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// orderWitness checks invariant 3's order at the moment the settler mirrors
// the witness: every recorded row is already charged in Postgres (its
// transaction, which bumped the witness, committed) and no entry is acked yet.
type orderWitness struct {
	t      *testing.T
	check  func()
	mu     sync.Mutex
	seq    int64
	mirror int
}

func (w *orderWitness) Writer() string { return "consumer/settler-test" }
func (w *orderWitness) Committed(seq int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq = max(w.seq, seq)
}
func (w *orderWitness) Mirror(context.Context) error {
	w.mu.Lock()
	w.mirror++
	seq := w.seq
	w.mu.Unlock()
	if seq == 0 {
		w.t.Error("Mirror before the group's transaction bumped and committed the witness")
	}
	w.check()
	return nil
}
func (w *orderWitness) Suspect() bool        { return false }
func (w *orderWitness) LostSince() time.Time { return time.Time{} }

// noStripe: the settler never calls Stripe (the charges were made).
type noStripe struct{ Stripe }

// TestSettlerRecordsThenAcksAFencedOutChargeIsNotAcked hands the settler
// three charges of one group, one of them from a holder whose lease another
// consumer took over (partial batch / reclaim while in flight): the two
// recorded are charged in the ledger, then witnessed, then acked, in that
// order; the fenced-out one leaves the new holder's row alone and its entry
// pending.
func TestSettlerRecordsThenAcksAFencedOutChargeIsNotAcked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewSim(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	pool := testenv.DB(t)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream)
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	var evs []event.Event
	for i := range 3 {
		e := event.Event{CustomerID: string(rune('a'+i)) + "_cust", StripeCustomerID: "cus_" + string(rune('a'+i)),
			AmountCents: 1000, BillingPeriod: "2026-11", Currency: "usd"}
		evs = append(evs, e)
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "A", Streams: []string{stream, ">"}, Count: 3, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	msgs := res[0].Messages
	l := ledger.New(pool, testenv.SchemaOf(pool), clk)
	pending := func() int64 {
		p, err := rdb.XPending(ctx, stream, "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		return p.Count
	}
	w := &orderWitness{t: t}
	w.check = func() {
		for _, i := range []int{0, 2} {
			if r, _ := l.Get(ctx, ledger.EventKey(evs[i])); r.Status != ledger.StatusCharged {
				t.Errorf("mirror before %s was recorded: %s", r.Key, r.Status)
			}
		}
		if n := pending(); n != 3 {
			t.Errorf("%d entries pending at the mirror, want 3 (nothing acked before it)", n)
		}
	}
	p, err := NewProcessor(Config{Redis: rdb, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: noStripe{}, Stream: stream,
		Group: "g", Name: "A", Namespace: "test", Lease: 3 * time.Second, Clock: clk, Witness: w, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var recs []ledger.Record
	for _, e := range evs {
		c, err := l.Reserve(ctx, ledger.ReserveRequest{Event: e, IdempotencyKey: e.Key("test"), Owner: "A", Lease: 3 * time.Second, MessageID: "1-0"})
		if err != nil || c.Decision != ledger.Acquired {
			t.Fatalf("reserve: %+v %v", c, err)
		}
		recs = append(recs, c.Record)
	}
	// A stalled past its lease on b_cust; B took it over (a new epoch).
	clk.Advance(4 * time.Second)
	taken, err := l.Reserve(ctx, ledger.ReserveRequest{Event: evs[1], IdempotencyKey: evs[1].Key("test"), Owner: "B", Lease: 3 * time.Second, MessageID: "1-0"})
	if err != nil || taken.Decision != ledger.TakenOver {
		t.Fatalf("takeover: %+v %v", taken, err)
	}

	s := newSettler(p, 16)
	got := make([]Outcome, 3)
	var batch []settleReq
	for i, m := range msgs {
		h := p.hb.add(ctx, stream, m.ID)
		batch = append(batch, settleReq{ctx: ctx, h: h, rec: recs[i], chargeID: "ch_" + evs[i].CustomerID,
			done: func(out Outcome, err error) {
				if err != nil {
					t.Errorf("%s: %v", evs[i].CustomerID, err)
				}
				got[i] = out
			}})
	}
	s.settle(batch)

	if got[0] != OutcomeCharged || got[1] != OutcomeLeaseLost || got[2] != OutcomeCharged {
		t.Fatalf("outcomes %v, want charged, lease_lost, charged", got)
	}
	if w.mirror != 1 {
		t.Fatalf("%d mirrors, want one for the group", w.mirror)
	}
	if n := pending(); n != 1 {
		t.Fatalf("%d entries pending, want only the fenced-out one", n)
	}
	r, _ := l.Get(ctx, ledger.EventKey(evs[1]))
	if r.Status != ledger.StatusPending || r.LeaseOwner != "B" || r.Epoch != taken.Record.Epoch {
		t.Fatalf("taken-over row: %+v, want B's pending row untouched", r)
	}
}
