package meterledger

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Reserve reads, decides, then writes: whatever another consumer does in
// between, the write checks the state it decided from and sends nothing
// twice. Each case runs the first half of a Reserve, lets another
// consumer act, and then the second half.
func TestWriteChecksWhatItDecidedFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*Ledger, *clock.Sim, *pgxpool.Pool) {
		clk := clock.NewSim(t0)
		pool := testenv.DB(t)
		l, err := New(pool, Config{Schema: testenv.SchemaOf(pool), Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.EnsurePartitions(ctx, t0); err != nil {
			t.Fatal(err)
		}
		return l, clk, pool
	}
	reserve := func(t *testing.T, l *Ledger, r Request) Claim {
		t.Helper()
		c, err := l.Reserve(ctx, []Request{r})
		if err != nil {
			t.Fatal(err)
		}
		return c[0]
	}
	finish := func(t *testing.T, l *Ledger, c Claim, res Result) {
		t.Helper()
		if rec, err := l.Finish(ctx, []Outcome{{Hold: c.Hold(), Result: res, Reason: "x"}}); err != nil || !rec[0] {
			t.Fatalf("finish: %v %v", rec, err)
		}
	}
	// firstHalf reads and decides as Reserve does; the returned func writes.
	firstHalf := func(t *testing.T, l *Ledger, clk *clock.Sim, r Request, want Decision) func() Claim {
		t.Helper()
		now := clk.Now()
		items, err := l.read(ctx, []Request{r})
		if err != nil {
			t.Fatal(err)
		}
		l.decide(now, items)
		if items[0].claim.Decision != want {
			t.Fatalf("decided %v, want %v", items[0].claim.Decision, want)
		}
		return func() Claim {
			if err := l.write(ctx, items, now); err != nil {
				t.Fatal(err)
			}
			return items[0].claim
		}
	}
	slots := func(t *testing.T, pool *pgxpool.Pool) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM meter_inflight`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("a new event reserved and delivered meanwhile", func(t *testing.T) {
		t.Parallel()
		l, clk, pool := setup(t)
		r := testReq("cus_1", "api", 3, t0)
		write := firstHalf(t, l, clk, r, Acquired)
		other := r
		other.Owner = "C"
		finish(t, l, reserve(t, l, other), Delivered)
		if c := write(); c.Decision != Busy {
			t.Fatalf("B: %v", c.Decision)
		}
		if got, _ := l.Get(ctx, KeyOf(r.Event, r.Identifier)); got.Status != StatusDelivered || got.Epoch != 1 {
			t.Fatalf("the row: epoch %d owner %q status %s attempts %d", got.Epoch, got.LeaseOwner, got.Status, got.Attempts)
		}
		if slots(t, pool) != 0 {
			t.Fatal("B's unused slot grant was not given back")
		}
	})
	t.Run("a released event taken over meanwhile", func(t *testing.T) {
		t.Parallel()
		l, clk, pool := setup(t)
		r := testReq("cus_1", "api", 3, t0)
		finish(t, l, reserve(t, l, r), Release)
		write := firstHalf(t, l, clk, r, TakenOver)
		c := reserve(t, l, r)
		finish(t, l, c, Release) // epoch 2, released again
		if c := write(); c.Decision != Busy {
			t.Fatalf("B: %v", c.Decision)
		}
		if got, _ := l.Get(ctx, KeyOf(r.Event, r.Identifier)); got.Epoch != 2 || got.LeaseOwner != "" || got.Attempts != 2 {
			t.Fatalf("the row: epoch %d owner %q status %s attempts %d", got.Epoch, got.LeaseOwner, got.Status, got.Attempts)
		}
		if slots(t, pool) != 0 {
			t.Fatal("B's unused slot grant was not given back")
		}
	})
	t.Run("the slot taken by another event meanwhile", func(t *testing.T) {
		t.Parallel()
		l, clk, _ := setup(t)
		r := testReq("cus_1", "api", 3, t0)
		write := firstHalf(t, l, clk, r, Acquired)
		y := reserve(t, l, testReq("cus_1", "api", 4, t0))
		if c := write(); c.Decision != SlotBusy {
			t.Fatalf("B: %v", c.Decision)
		}
		if _, err := l.Get(ctx, KeyOf(r.Event, r.Identifier)); err == nil {
			t.Fatal("a row was written without the slot")
		}
		if c := reserve(t, l, r); c.Decision != SlotBusy {
			t.Fatalf("while y is in flight: %v", c.Decision)
		}
		finish(t, l, y, Delivered)
		if c := reserve(t, l, r); c.Decision != Acquired {
			t.Fatalf("after y: %v", c.Decision)
		}
	})
	t.Run("an expired slot taken over meanwhile", func(t *testing.T) {
		t.Parallel()
		l, clk, _ := setup(t)
		x := reserve(t, l, testReq("cus_1", "api", 1, t0)) // its holder dies
		clk.Advance(time.Minute)
		r := testReq("cus_1", "api", 3, t0)
		write := firstHalf(t, l, clk, r, Acquired) // the slot expired: B will take it
		y := reserve(t, l, testReq("cus_1", "api", 4, t0))
		if y.Decision != Acquired {
			t.Fatalf("y: %v", y.Decision)
		}
		if c := write(); c.Decision != SlotBusy {
			t.Fatalf("B: %v (y holds the slot)", c.Decision)
		}
		if rec, _ := l.Finish(ctx, []Outcome{{Hold: x.Hold(), Result: Release}}); !rec[0] {
			t.Fatal("x's late release")
		}
		if c := reserve(t, l, r); c.Decision != SlotBusy {
			t.Fatalf("x's late release freed y's slot: %v", c.Decision)
		}
	})
	t.Run("a park made meanwhile", func(t *testing.T) {
		t.Parallel()
		l, clk, _ := setup(t)
		w := &countWitness{}
		l.SetWitness(w)
		r := testReq("cus_1", "api", 3, t0)
		finish(t, l, reserve(t, l, r), Release)
		w.n = 0
		clk.Advance(24 * time.Hour)
		write := firstHalf(t, l, clk, r, Parked)
		if c := reserve(t, l, r); c.Decision != Parked {
			t.Fatalf("C: %v", c.Decision)
		}
		if c := write(); c.Decision != Busy || w.n != 1 {
			t.Fatalf("B: %v; witness bumped %d times, want 1 (C's park)", c.Decision, w.n)
		}
	})
}

type countWitness struct{ n int }

func (w *countWitness) Writer() string  { return "w" }
func (w *countWitness) Committed(int64) { w.n++ }
