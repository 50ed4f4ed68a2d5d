package meterledger

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// The cap is checked where the count is added, on the latest committed
// count, not on what Reserve read: whatever is counted or changed between
// a reservation's read and its write, the customer's use never passes the
// cap, and a write that does not happen takes nothing.
func TestCapCheckedOnTheLatestCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) *Ledger {
		t.Helper()
		l := capLedger(t)
		if _, err := l.SetCap(ctx, Cap{EventName: "api", StripeCustomerID: "cus_1", Month: AnyMonth, Cap: 10}); err != nil {
			t.Fatal(err)
		}
		return l
	}
	used := func(t *testing.T, l *Ledger) (int64, int64) {
		t.Helper()
		us, err := l.Usage(ctx, "api", "cus_1", t0)
		if err != nil || len(us) != 1 {
			t.Fatalf("usage: %v %v", us, err)
		}
		return us[0].Units, us[0].Events
	}
	deliver := func(t *testing.T, l *Ledger, r Request) {
		t.Helper()
		c, err := l.Reserve(ctx, []Request{r})
		if err != nil || c[0].Decision != Acquired {
			t.Fatalf("reserve %v: %v %v", r.Event.Value, c, err)
		}
		if rec, err := l.Finish(ctx, []Outcome{{Hold: c[0].Hold(), Result: Delivered}}); err != nil || !rec[0] {
			t.Fatalf("finish: %v %v", rec, err)
		}
	}
	half := func(t *testing.T, l *Ledger, r Request) func() (Claim, int) {
		t.Helper()
		now := l.clock.Now()
		items, err := l.read(ctx, []Request{r})
		if err != nil {
			t.Fatal(err)
		}
		l.decide(now, items)
		if items[0].claim.Decision != Acquired {
			t.Fatalf("decided %v from the read, want acquired", items[0].claim.Decision)
		}
		return func() (Claim, int) {
			if err := l.write(ctx, items, now); err != nil {
				t.Fatal(err)
			}
			var slots int
			if err := l.pool.QueryRow(ctx, `SELECT count(*) FROM {schema}.meter_inflight`).Scan(&slots); err != nil {
				t.Fatal(err)
			}
			return items[0].claim, slots
		}
	}

	t.Run("another event counted meanwhile", func(t *testing.T) {
		t.Parallel()
		l := setup(t)
		deliver(t, l, testReq("cus_1", "api", 6, t0))
		write := half(t, l, testReq("cus_1", "api", 4, t0.Add(time.Second))) // 6 + 4 fits, as read
		deliver(t, l, testReq("cus_1", "api", 3, t0.Add(2*time.Second)))     // 9 now
		c, slots := write()
		if c.Decision != OverCap || c.Cap.Units != 9 || c.Cap.Cap.Cap != 10 {
			t.Fatalf("write: %v %+v (%s)", c.Decision, c.Cap, c.Reason)
		}
		if u, n := used(t, l); u != 9 || n != 2 {
			t.Fatalf("used %d units in %d events, want 9 in 2", u, n)
		}
		if slots != 0 {
			t.Fatal("the refused send's slot grant was not given back")
		}
	})
	t.Run("the cap lowered meanwhile", func(t *testing.T) {
		t.Parallel()
		l := setup(t)
		write := half(t, l, testReq("cus_1", "api", 4, t0))
		if _, err := l.SetCap(ctx, Cap{EventName: "api", StripeCustomerID: "cus_1", Month: "2026-11", Cap: 3}); err != nil {
			t.Fatal(err)
		}
		c, _ := write()
		if c.Decision != OverCap || c.Cap.Cap.Cap != 3 || c.Cap.Cap.Month != "2026-11" {
			t.Fatalf("write: %v %+v", c.Decision, c.Cap)
		}
		if r := testReq("cus_1", "api", 4, t0); func() bool { _, err := l.Get(ctx, KeyOf(r.Event, r.Identifier)); return err == nil }() {
			t.Fatal("a row was written past the cap")
		}
	})
	t.Run("the event itself reserved meanwhile", func(t *testing.T) {
		t.Parallel()
		l := setup(t)
		r := testReq("cus_1", "api", 4, t0)
		write := half(t, l, r)
		other := r
		other.Owner = "C"
		deliver(t, l, other)
		c, slots := write()
		if c.Decision != Busy {
			t.Fatalf("write: %v", c.Decision)
		}
		if u, n := used(t, l); u != 4 || n != 1 {
			t.Fatalf("used %d units in %d events, want the one event's 4: the unwritten send's count was not given back", u, n)
		}
		if slots != 0 {
			t.Fatal("the unwritten send's slot grant was not given back")
		}
	})
}

func capLedger(t *testing.T) *Ledger {
	t.Helper()
	pool := testenv.DB(t)
	l, err := New(pool, Config{Schema: testenv.SchemaOf(pool), Clock: clock.NewSim(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePartitions(context.Background(), t0); err != nil {
		t.Fatal(err)
	}
	return l
}
