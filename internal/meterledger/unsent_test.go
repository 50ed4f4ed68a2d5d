package meterledger

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// An event reserved and then not sent (its stream was paused before its
// call) is given back as Unsent: lease and slot freed, the row still
// sending, and, unlike a Release, not recorded as an attempt of unknown
// outcome, so nothing counts it as maybe at Stripe. The next reservation
// takes it over and sends it under the same identifier.
func TestUnsentIsNotAnAttemptOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		res         Result
		wantUnknown bool
	}{{Unsent, false}, {Release, true}} {
		t.Run(tc.res.String(), func(t *testing.T) {
			clk := clock.NewSim(t0)
			pool := testenv.DB(t)
			l, err := New(pool, Config{Schema: testenv.SchemaOf(pool), Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.EnsurePartitions(ctx, t0); err != nil {
				t.Fatal(err)
			}
			r := testReq("cus_1", "api", 3, t0)
			c, err := l.Reserve(ctx, []Request{r})
			if err != nil || c[0].Decision != Acquired {
				t.Fatalf("reserve: %v %v", c, err)
			}
			if rec, err := l.Finish(ctx, []Outcome{{Hold: c[0].Hold(), Result: tc.res}}); err != nil || !rec[0] {
				t.Fatalf("finish: %v %v", rec, err)
			}
			got, err := l.Get(ctx, KeyOf(r.Event, r.Identifier))
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != StatusSending || got.LeaseOwner != "" || got.OutcomeUnknown != tc.wantUnknown {
				t.Fatalf("the row: status %s owner %q outcome_unknown %t; want sending, no owner, %t", got.Status, got.LeaseOwner, got.OutcomeUnknown, tc.wantUnknown)
			}
			var slots int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM meter_inflight`).Scan(&slots); err != nil || slots != 0 {
				t.Fatalf("%d slots held (%v)", slots, err)
			}
			clk.Advance(time.Minute)
			c, err = l.Reserve(ctx, []Request{r})
			if err != nil || c[0].Decision != TakenOver {
				t.Fatalf("the next delivery: %v %v, want taken over", c, err)
			}
		})
	}
}
