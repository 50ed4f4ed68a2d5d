package meterledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

func (b bundle) setCap(t *testing.T, c meterledger.Cap) {
	t.Helper()
	if _, err := b.l.SetCap(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) used(t *testing.T, meter, cust string, month time.Time) (units, events int64) {
	t.Helper()
	us, err := b.l.Usage(context.Background(), meter, cust, month)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) == 0 {
		return 0, 0
	}
	return us[0].Units, us[0].Events
}

// send reserves one event and records outcome res when it may be sent; it
// returns the decision.
func (b bundle) send(t *testing.T, r meterledger.Request, res meterledger.Result) meterledger.Claim {
	t.Helper()
	c := b.one(t, r)
	if c.Decision.MaySend() {
		if rec := b.finish(t, meterledger.Outcome{Hold: c.Hold(), Result: res, Reason: "refused"}); !rec[0] {
			t.Fatalf("finish %s: not recorded", r.Identifier)
		}
	}
	return c
}

// A customer's cap in the meter's units: the event that would pass it is
// refused with the cap and the use in the claim, nothing written; raising
// the cap lets the same event through.
func TestMeterCapRefusesTheEventThatWouldPassIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-11", Cap: 10})
	for i := range 3 {
		if c := b.send(t, req(mev("cus_1", "api", 3, t0.Add(time.Duration(i)*time.Second)), "A"), meterledger.Delivered); c.Decision != meterledger.Acquired {
			t.Fatalf("event %d: %v %s", i, c.Decision, c.Reason)
		}
	}
	over := req(mev("cus_1", "api", 3, t0.Add(time.Minute)), "A")
	c := b.one(t, over)
	if c.Decision != meterledger.OverCap || c.Cap.Units != 9 || c.Cap.Cap.Cap != 10 || c.Cap.Month != meterledger.MonthOf(t0) {
		t.Fatalf("the fourth: %v %+v", c.Decision, c.Cap)
	}
	for _, want := range []string{"api cap of 10 units for cus_1 in 2026-11", "9 used", "adds 3", "raise the cap"} {
		if !strings.Contains(c.Reason, want) {
			t.Errorf("reason %q lacks %q", c.Reason, want)
		}
	}
	if _, err := b.l.Get(context.Background(), meterledger.KeyOf(over.Event, over.Identifier)); err == nil {
		t.Fatal("a row was written for a refused event")
	}
	if n := b.count(t, `SELECT count(*) FROM meter_inflight`); n != 0 {
		t.Fatalf("%d slots held after a refusal", n)
	}
	// Other customers and months are not this cap's.
	if c := b.send(t, req(mev("cus_2", "api", 50, t0), "A"), meterledger.Delivered); c.Decision != meterledger.Acquired {
		t.Fatalf("another customer: %v", c.Decision)
	}
	if c := b.send(t, req(mev("cus_1", "api", 50, t0.AddDate(0, -1, 0)), "A"), meterledger.Delivered); c.Decision != meterledger.Acquired {
		t.Fatalf("October: %v", c.Decision)
	}
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-11", Cap: 12})
	if c := b.send(t, over, meterledger.Delivered); c.Decision != meterledger.Acquired {
		t.Fatalf("after raising the cap: %v %s", c.Decision, c.Reason)
	}
	if u, n := b.used(t, "api", "cus_1", t0); u != 12 || n != 4 {
		t.Fatalf("November: %d units in %d events, want 12 in 4", u, n)
	}
}

// The most specific cap applies: the customer's own before every
// customer's, a month's before every month's; each customer is counted on
// its own under a cap of every customer.
func TestMeterCapPrecedence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: meterledger.AnyCustomer, Month: meterledger.AnyMonth, Cap: 5})
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: meterledger.AnyCustomer, Month: "2026-11", Cap: 7})
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_big", Month: meterledger.AnyMonth, Cap: 100})
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_big", Month: "2026-11", Cap: 50})
	oct := t0.AddDate(0, -1, 0) // within Stripe's 35 days
	cases := []struct {
		cust  string
		ts    time.Time
		value int64
		want  meterledger.Decision
	}{
		{"cus_a", t0, 7, meterledger.Acquired}, // every customer in November: 7
		{"cus_b", t0, 7, meterledger.Acquired}, // counted on its own
		{"cus_a", t0.Add(time.Second), 1, meterledger.OverCap},
		{"cus_a", oct, 5, meterledger.Acquired}, // every customer, every month: 5
		{"cus_a", oct.Add(time.Second), 1, meterledger.OverCap},
		{"cus_big", t0, 50, meterledger.Acquired}, // its own November cap
		{"cus_big", t0.Add(time.Second), 1, meterledger.OverCap},
		{"cus_big", oct, 100, meterledger.Acquired},                  // its own every-month cap
		{"cus_a", t0.Add(2 * time.Second), -3, meterledger.Acquired}, // a negative value adds nothing: always passes
		{"cus_a", t0.Add(3 * time.Second), 0, meterledger.Acquired},
		{"other_meter_cus", t0, 1000, meterledger.Acquired}, // no cap of this meter below
	}
	for i, tc := range cases {
		meter := "api"
		if strings.HasPrefix(tc.cust, "other_meter") {
			meter = "storage"
		}
		if c := b.send(t, req(mev(tc.cust, meter, tc.value, tc.ts), "A"), meterledger.Delivered); c.Decision != tc.want {
			t.Errorf("case %d (%s %d at %s): %v, want %v (%s)", i, tc.cust, tc.value, tc.ts.Format("2006-01-02"), c.Decision, tc.want, c.Reason)
		}
	}
	if u, n := b.used(t, "api", "cus_a", t0); u != 4 || n != 3 {
		t.Fatalf("cus_a in November: %d units in %d events, want 7 - 3 + 0 = 4 in 3", u, n)
	}
	caps, err := b.l.Caps(context.Background(), "api")
	if err != nil || len(caps) != 4 || caps[0].StripeCustomerID != meterledger.AnyCustomer || caps[0].Month != meterledger.AnyMonth {
		t.Fatalf("caps: %+v %v", caps, err)
	}
	c, found, err := b.l.CapFor(context.Background(), "api", "cus_big", t0)
	if err != nil || !found || c.Cap != 50 {
		t.Fatalf("CapFor(cus_big, November): %+v %v %v", c, found, err)
	}
	if err := b.l.RemoveCap(context.Background(), "api", "cus_big", "2026-11"); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := b.l.CapFor(context.Background(), "api", "cus_big", t0); c.Cap != 100 {
		t.Fatalf("after removing its November cap: %+v", c)
	}
	if err := b.l.RemoveCap(context.Background(), "api", "cus_big", "2026-11"); err == nil {
		t.Fatal("removing a missing cap succeeded")
	}
}

// A cap on a count meter bounds the number of events, whatever their values.
func TestMeterCapCountingEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setCap(t, meterledger.Cap{EventName: "logins", StripeCustomerID: "cus_1", Month: meterledger.AnyMonth, Cap: 2, Counts: meterledger.CountEvents})
	for i, want := range []meterledger.Decision{meterledger.Acquired, meterledger.Acquired, meterledger.OverCap} {
		if c := b.send(t, req(mev("cus_1", "logins", 1000, t0.Add(time.Duration(i)*time.Second)), "A"), meterledger.Delivered); c.Decision != want {
			t.Fatalf("event %d: %v, want %v", i, c.Decision, want)
		}
	}
}

// What may count at Stripe counts: sending (unknown outcome), delivered and
// parked events. A failed one (Stripe refused it) gives its units back; its
// replay counts them again, a parked one's replay does not count twice.
func TestMeterUsageFollowsOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_1", Month: meterledger.AnyMonth, Cap: 20})
	check := func(step string, units, events int64) {
		t.Helper()
		if u, n := b.used(t, "api", "cus_1", t0); u != units || n != events {
			t.Fatalf("%s: %d units in %d events, want %d in %d", step, u, n, units, events)
		}
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	b.send(t, req(mev("cus_1", "api", 5, at(1)), "A"), meterledger.Delivered)
	check("delivered", 5, 1)
	b.send(t, req(mev("cus_1", "api", 4, at(2)), "A"), meterledger.Release)
	check("unknown outcome", 9, 2)
	failed := req(mev("cus_1", "api", 6, at(3)), "A")
	b.send(t, failed, meterledger.Failed)
	check("failed", 9, 2)
	parked := req(mev("cus_1", "api", 3, at(4)), "A")
	b.send(t, parked, meterledger.Park)
	check("parked", 12, 3)

	replay := func(r meterledger.Request) meterledger.Request { r.Replay = true; return r }
	if c := b.send(t, replay(failed), meterledger.Delivered); c.Decision != meterledger.Reopened {
		t.Fatalf("replay of the failed: %v", c.Decision)
	}
	check("the failed replayed", 18, 4)
	if c := b.send(t, replay(parked), meterledger.Delivered); c.Decision != meterledger.Reopened {
		t.Fatalf("replay of the parked: %v", c.Decision)
	}
	check("the parked replayed", 18, 4)
	// The cap holds for replays of failed events too.
	big := req(mev("cus_1", "api", 2, at(5)), "A")
	b.send(t, big, meterledger.Failed)
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_1", Month: meterledger.AnyMonth, Cap: 19})
	if c := b.one(t, replay(big)); c.Decision != meterledger.OverCap {
		t.Fatalf("replay of a failed event past the cap: %v", c.Decision)
	}
	if r, _ := b.l.Get(context.Background(), meterledger.KeyOf(big.Event, big.Identifier)); r.Status != meterledger.StatusFailed {
		t.Fatalf("the refused replay's row: %s", r.Status)
	}
	check("a replay refused", 18, 4)
}

// Consumers racing on one customer's meter with the cap nearly reached:
// exactly the events that fit are sent, never one more.
func TestMeterCapHoldsUnderConcurrentReservations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit, workers, each = 40, 6, 15 // 90 events of 1 unit for a cap of 40
	b.setCap(t, meterledger.Cap{EventName: "api", StripeCustomerID: "cus_1", Month: meterledger.AnyMonth, Cap: limit})
	var mu sync.Mutex
	decisions := map[meterledger.Decision]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				r := req(mev("cus_1", "api", 1, t0.Add(time.Duration(w*each+i)*time.Millisecond)), fmt.Sprint("w", w))
				c, err := b.l.Reserve(context.Background(), []meterledger.Request{r})
				if err != nil {
					t.Error(err)
					return
				}
				if c[0].Decision == meterledger.SlotBusy || c[0].Decision == meterledger.Busy {
					continue // another worker's event is in flight: try again
				}
				if c[0].Decision.MaySend() {
					if _, err := b.l.Finish(context.Background(), []meterledger.Outcome{{Hold: c[0].Hold(), Result: meterledger.Delivered}}); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				decisions[c[0].Decision]++
				mu.Unlock()
				i++
			}
		}()
	}
	wg.Wait()
	if decisions[meterledger.Acquired] != limit || decisions[meterledger.OverCap] != workers*each-limit {
		t.Fatalf("decisions %v, want %d acquired and %d over the cap", decisions, limit, workers*each-limit)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_events WHERE status = 'delivered'`); n != limit {
		t.Fatalf("%d delivered rows, want %d", n, limit)
	}
	if u, n := b.used(t, "api", "cus_1", t0); u != limit || n != limit {
		t.Fatalf("used %d in %d events, want %d", u, n, limit)
	}
}

func TestMeterCapValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []meterledger.Cap{
		{EventName: "", StripeCustomerID: "cus_1", Month: "2026-11", Cap: 1},
		{EventName: "api", StripeCustomerID: "", Month: "2026-11", Cap: 1},
		{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-13", Cap: 1},
		{EventName: "api", StripeCustomerID: "cus_1", Month: "Nov", Cap: 1},
		{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-11", Cap: -1},
		{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-11", Cap: 1, Counts: "dollars"},
	} {
		if _, err := b.l.SetCap(context.Background(), c); err == nil {
			t.Errorf("SetCap(%+v) accepted", c)
		}
	}
}

// Prune deletes the monthly counts 13 months after their month.
func TestPruneDropsOldUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send(t, req(mev("cus_1", "api", 3, t0), "A"), meterledger.Delivered)
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO meter_usage (event_name, stripe_customer_id, month, units, events, updated_at)
		VALUES ('api', 'cus_1', '2025-10-01', 7, 1, now()), ('api', 'cus_1', '2025-11-01', 8, 1, now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.l.Prune(context.Background(), t0); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM meter_usage WHERE month < '2025-11-01'`); n != 0 {
		t.Fatal("the count of October 2025 is still there in November 2026")
	}
	if n := b.count(t, `SELECT count(*) FROM meter_usage`); n != 2 {
		t.Fatalf("%d counts left, want November 2025 and 2026", n)
	}
}
