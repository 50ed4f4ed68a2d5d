package meterledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
)

// Stripe allows one concurrent call per customer per meter. Two events of
// one customer and meter are never both sendable: within a batch, across
// batches, after a holder dies, and when the slot expires under it.
func TestOneEventPerCustomerMeterInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e1, e2 := mev("cus_1", "api_requests", 1, t0), mev("cus_1", "api_requests", 2, t0)
	other := mev("cus_1", "tokens", 1, t0)
	cs := b.reserve(t, req(e2, "A"), req(e1, "A"), req(other, "A"))
	if cs[0].Decision != meterledger.SlotBusy || cs[1].Decision != meterledger.Acquired || cs[2].Decision != meterledger.Acquired {
		t.Fatalf("one batch: %v %v %v", cs[0].Decision, cs[1].Decision, cs[2].Decision)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE identifier = $1`, req(e2, "A").Identifier); n != 0 {
		t.Fatal("a SlotBusy event was written")
	}
	if c := b.one(t, req(e2, "B")); c.Decision != meterledger.SlotBusy {
		t.Fatalf("another consumer, e1 in flight: %v", c.Decision)
	}
	// e1's holder dies: when its lease (and slot) expire, e2 goes first;
	// e1's redelivery waits for it, then re-sends under its identifier.
	b.clk.Advance(31 * time.Second)
	c2 := b.one(t, req(e2, "B"))
	if c2.Decision != meterledger.Acquired {
		t.Fatalf("after e1's holder died: %v", c2.Decision)
	}
	if c := b.one(t, req(e1, "B")); c.Decision != meterledger.SlotBusy {
		t.Fatalf("e1 while e2 is in flight: %v", c.Decision)
	}
	// e1's holder wakes up: its slot is gone (lost), its row still its own.
	if lost, err := b.l.ExtendMany(ctx, []meterledger.Hold{cs[1].Hold(), c2.Hold()}, 30*time.Second); err != nil || !lost[0] || lost[1] {
		t.Fatalf("extend after the slot was taken: %v %v", lost, err)
	}
	b.finish(t, meterledger.Outcome{Hold: c2.Hold(), Result: meterledger.Delivered})
	if c := b.one(t, req(e1, "B")); c.Decision != meterledger.TakenOver {
		t.Fatalf("e1 after e2: %v", c.Decision)
	}
}

// Two consumers reserve overlapping batches at once, many times over, with
// holders that die; at no moment are two events of one customer and meter
// sendable, no event is sendable twice, and every event ends delivered
// once.
func TestSlotAcrossConcurrentConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var events []event.MeterEvent
	for c := range 4 {
		for m := range 2 {
			for v := range 4 {
				events = append(events, mev(fmt.Sprintf("cus_%d", c), fmt.Sprintf("meter_%d", m), int64(v+1), t0.Add(time.Duration(v)*time.Second)))
			}
		}
	}
	type held struct {
		hold  meterledger.Hold
		owner string
	}
	inflight := map[[2]string]held{} // what an emulated Stripe would see in flight
	delivered := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; len(delivered) < len(events); iter++ {
		if iter > 200 {
			t.Fatalf("%d of %d events delivered after 200 rounds", len(delivered), len(events))
		}
		batches := make([][]meterledger.Request, 2)
		for c := range batches {
			for _, i := range rng.Perm(len(events))[:len(events)*2/3] { // overlapping, any order
				batches[c] = append(batches[c], req(events[i], fmt.Sprintf("consumer-%d", c)))
			}
		}
		claims := make([][]meterledger.Claim, 2)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for c := range batches {
			wg.Add(1)
			go func() {
				defer wg.Done()
				claims[c], errs[c] = b.l.Reserve(ctx, batches[c])
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatal(errs)
		}
		var outs [2][]meterledger.Outcome
		for c := range claims {
			for i, cl := range claims[c] {
				if !cl.Decision.MaySend() {
					continue
				}
				ev := batches[c][i].Event
				k := [2]string{ev.StripeCustomerID, ev.EventName}
				if h, busy := inflight[k]; busy {
					t.Fatalf("round %d: %s sendable while %s of %v is in flight (%s)", iter, cl.Record.Identifier, h.hold.Identifier, k, h.owner)
				}
				if delivered[cl.Record.Identifier] {
					t.Fatalf("round %d: delivered event %s sendable again", iter, cl.Record.Identifier)
				}
				inflight[k] = held{cl.Hold(), fmt.Sprint(c)}
				res := meterledger.Delivered
				switch rng.IntN(6) {
				case 0:
					continue // the holder dies: its lease and slot expire below
				case 1:
					res = meterledger.Release
				}
				outs[c] = append(outs[c], meterledger.Outcome{Hold: cl.Hold(), Result: res, Reason: "timeout"})
			}
		}
		for c := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var rec []bool
				rec, errs[c] = b.l.Finish(ctx, outs[c])
				for i, ok := range rec {
					if !ok {
						errs[c] = fmt.Errorf("outcome of %s not recorded", outs[c][i].Hold.Identifier)
					}
				}
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatal(errs)
		}
		for c := range outs {
			for _, o := range outs[c] {
				delete(inflight, [2]string{o.Hold.StripeCustomerID, o.Hold.EventName})
				if o.Result == meterledger.Delivered {
					delivered[o.Hold.Identifier] = true
				}
			}
		}
		if iter%3 == 2 { // the dead holders' leases expire
			b.clk.Advance(31 * time.Second)
			clear(inflight)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE status = 'delivered'`); n != len(events) {
		t.Fatalf("%d delivered rows, want %d", n, len(events))
	}
}
