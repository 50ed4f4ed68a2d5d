package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestReserveBatchDecidesAsReserve puts one batch through every decision
// Reserve makes (new row, takeover above the epoch floor, terminal, busy,
// conflict, a cap spent in request order, --require-cap without a cap) and
// checks each claim, the epochs, the rows and the cap's reservation; what
// the batch leaves to Reserve (a key twice, a replay of a failed row) is
// left undecided and written nowhere.
func TestReserveBatchDecidesAsReserve(t *testing.T) {
	t.Parallel()
	clk := clock.NewSim(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	pool := testenv.DB(t)
	l := ledger.New(pool, testenv.SchemaOf(pool), clk)
	ctx := context.Background()

	// The rows as earlier deliveries left them.
	charged, busy, expired, conflict, failed := ev("charged", 100), ev("busy", 100), ev("expired", 100), ev("conflict", 100), ev("failed", 100)
	for _, e := range []ledger.ReserveRequest{req(charged, "X"), req(busy, "X"), req(expired, "X"), req(conflict, "X"), req(failed, "X")} {
		if _, err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	finish := func(e ledger.ReserveRequest, o ledger.Outcome) {
		rec, err := l.Get(ctx, ledger.EventKey(e.Event))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Finish(ctx, rec, o); err != nil {
			t.Fatal(err)
		}
	}
	finish(req(charged, "X"), ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_charged"})
	finish(req(failed, "X"), ledger.Outcome{Status: ledger.StatusFailed, Error: "invalid"})
	clk.Advance(20 * time.Second)
	// busy's lease is renewed; expired's is not.
	busyRec, _ := l.Get(ctx, ledger.EventKey(busy))
	if err := l.Extend(ctx, busyRec, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(15 * time.Second)
	if _, err := pool.Exec(ctx, `UPDATE ledger_fence SET epoch_floor = 1000`); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetCap(ctx, "2026-12", 250); err != nil {
		t.Fatal(err)
	}
	capped := func(cust string, amount int64) ledger.ReserveRequest {
		e := ev(cust, amount)
		e.BillingPeriod = "2026-12"
		return req(e, "A")
	}
	changed := conflict
	changed.AmountCents = 999
	replay := req(failed, "A")
	replay.Replay = true
	noCap := req(ev("nocap", 100), "A")
	noCap.RequireCap = true

	reqs := []ledger.ReserveRequest{
		req(ev("new", 100), "A"), // 0 Acquired above the floor
		req(expired, "A"),        // 1 TakenOver above the floor
		req(charged, "A"),        // 2 AlreadyTerminal
		req(busy, "A"),           // 3 Busy
		req(changed, "A"),        // 4 Conflict
		capped("cap1", 100),      // 5 Acquired, 100 reserved
		capped("cap2", 200),      // 6 over the cap (100 + 200 > 250)
		capped("cap3", 150),      // 7 Acquired, 250 reserved (in request order, as Reserve one by one)
		noCap,                    // 8 ErrNoCap
		req(ev("new", 100), "A"), // 9 the same key again: left to Reserve
		replay,                   // 10 a replay of a failed row: left to Reserve
		{Event: ev("bad", 1)},    // 11 no owner: left to Reserve, which says what is wrong
	}
	claims, err := l.ReserveBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []ledger.Decision{ledger.Acquired, ledger.TakenOver, ledger.AlreadyTerminal, ledger.Busy, ledger.Conflict,
		ledger.Acquired, 0, ledger.Acquired, 0, 0, 0, 0}
	for i, c := range claims {
		switch i {
		case 6:
			var ce *ledger.CapError
			if !c.Decided || !errors.As(c.Err, &ce) || ce.ReservedCents != 100 || ce.RequestedCents != 200 || ce.CapCents != 250 {
				t.Fatalf("claim 6: %+v, want a cap refusal with 100 of 250 reserved", c)
			}
		case 8:
			if !c.Decided || !errors.Is(c.Err, ledger.ErrNoCap) {
				t.Fatalf("claim 8: %+v, want ErrNoCap", c)
			}
		case 9, 10, 11:
			if c.Decided {
				t.Fatalf("claim %d: %+v, want it left to Reserve", i, c)
			}
		default:
			if !c.Decided || c.Err != nil || c.Claim.Decision != want[i] {
				t.Fatalf("claim %d: %+v, want %v", i, c, want[i])
			}
		}
	}
	if r := claims[0].Claim.Record; r.Epoch != 1001 || r.AttemptEpoch != 1001 || r.LeaseOwner != "A" || !r.LeaseLive(clk.Now()) {
		t.Fatalf("new row: %+v, want epoch 1001 held by A", r)
	}
	if r := claims[1].Claim.Record; r.Epoch != 1001 || r.Attempts != 2 || r.LeaseOwner != "A" || !r.LeaseLive(clk.Now()) {
		t.Fatalf("takeover: %+v, want epoch 1001 (past the floor), attempts 2, held by A", r)
	}
	if r := claims[3].Claim.Record; r.LeaseOwner != "X" {
		t.Fatalf("busy row: %+v, want X's lease untouched", r)
	}
	if r := claims[5].Claim.Record; r.CapReservedCents != 100 || r.Epoch != 1001 {
		t.Fatalf("capped row: %+v", r)
	}
	if r := claims[7].Claim.Record; r.CapReservedCents != 150 {
		t.Fatalf("capped row: %+v", r)
	}
	if c, err := l.Cap(ctx, "2026-12"); err != nil || c.ReservedCents != 250 {
		t.Fatalf("cap: %+v %v, want 250 reserved", c, err)
	}
	for _, k := range []string{"cap2", "nocap", "bad"} {
		p := "2026-11"
		if k == "cap2" {
			p = "2026-12"
		}
		if _, err := l.Get(ctx, ledger.Key{CustomerID: k, BillingPeriod: p}); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("%s: a refused request wrote a row (%v)", k, err)
		}
	}
	if r, _ := l.Get(ctx, ledger.EventKey(failed)); r.Status != ledger.StatusFailed {
		t.Fatalf("failed row: %+v, want untouched for Reserve's reopen", r)
	}
	// What the batch left undecided, Reserve decides as ever.
	if c, err := l.Reserve(ctx, reqs[9]); err != nil || c.Decision != ledger.Busy {
		t.Fatalf("second copy through Reserve: %+v %v, want Busy (the batch holds it)", c, err)
	}
	if c, err := l.Reserve(ctx, reqs[10]); err != nil || c.Decision != ledger.Reopened {
		t.Fatalf("replay through Reserve: %+v %v, want Reopened", c, err)
	}
}
