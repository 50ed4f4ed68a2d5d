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
// outcome and its attempt taken back (0), so nothing counts it as maybe at
// Stripe and it is not listed stuck. The next reservation, even 30 h later
// (a long pause, past the 23 h safe window), takes it over and sends it
// under the same identifier, its safe window starting then; a released
// event is parked instead.
func TestUnsentIsNotAnAttemptOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		res          Result
		wantUnknown  bool
		wantAttempts int
		wantNext     Decision
	}{{Unsent, false, 0, TakenOver}, {Release, true, 1, Parked}} {
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
			if got.Status != StatusSending || got.LeaseOwner != "" || got.OutcomeUnknown != tc.wantUnknown || got.Attempts != tc.wantAttempts {
				t.Fatalf("the row: status %s owner %q outcome_unknown %t attempts %d; want sending, no owner, %t, %d",
					got.Status, got.LeaseOwner, got.OutcomeUnknown, got.Attempts, tc.wantUnknown, tc.wantAttempts)
			}
			var slots int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM meter_inflight`).Scan(&slots); err != nil || slots != 0 {
				t.Fatalf("%d slots held (%v)", slots, err)
			}
			clk.Advance(30 * time.Hour)
			stuck, err := l.Stuck(ctx, clk.Now().Add(-time.Hour), 10)
			if err != nil || len(stuck) != tc.wantAttempts {
				t.Fatalf("stuck: %d rows (%v), want %d", len(stuck), err, tc.wantAttempts)
			}
			c, err = l.Reserve(ctx, []Request{r})
			if err != nil || c[0].Decision != tc.wantNext {
				t.Fatalf("the next delivery 30 h later: %v %v, want %v", c, err, tc.wantNext)
			}
			if tc.res != Unsent {
				return
			}
			got, _ = l.Get(ctx, KeyOf(r.Event, r.Identifier))
			if got.Attempts != 1 || got.OutcomeUnknown || !got.FirstSentAt.Equal(clk.Now().UTC().Truncate(time.Microsecond)) {
				t.Fatalf("taken over: attempts %d outcome_unknown %t first_sent_at %s; want 1, false, now (%s)",
					got.Attempts, got.OutcomeUnknown, got.FirstSentAt, clk.Now())
			}
		})
	}
}
