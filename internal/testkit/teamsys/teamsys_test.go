package teamsys_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Pools and the emulator's keep-alive connections wind down after
		// their tests' cleanups.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("github.com/jackc/puddle/v2.(*Pool[...]).createIdleResources.func1"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// The team's processes start Python and talk to real services: a generous
// deadline for conditions that normally hold within a second.
const deadline = 30 * time.Second

const period = "2026-11"

func events(n int) []event.Event {
	evs := make([]event.Event, n)
	for i := range evs {
		evs[i] = event.Event{
			CustomerID:       fmt.Sprintf("c_%d", i+1),
			StripeCustomerID: fmt.Sprintf("cus_team%d", i+1),
			AmountCents:      int64(1000 + i),
			BillingPeriod:    period,
			Currency:         "usd",
		}
	}
	return evs
}

// waitSettled waits until the team's table has rows rows and the PEL is empty.
func waitSettled(t *testing.T, env *teamsys.Env, rows int) {
	t.Helper()
	testenv.Eventually(t, deadline, func() bool {
		return len(env.Rows(t)) == rows && env.Pending(t) == 0
	}, "want %d billing_records rows and nothing pending", rows)
}

func onlyCharge(t *testing.T, env *teamsys.Env, ev event.Event) stripesim.Charge {
	t.Helper()
	chs := env.Charges(ev.StripeCustomerID, ev.BillingPeriod)
	if len(chs) != 1 {
		t.Fatalf("%s: %d succeeded charges at the emulator, want 1: %+v", ev.CustomerID, len(chs), chs)
	}
	return chs[0]
}

// The article's consumer, run as written, bills each event once: one charge
// per customer carrying the content-hash key, one 'charged' row naming it,
// every entry acked.
func TestConsumerBillsEachEventOnce(t *testing.T) {
	t.Parallel()
	env := teamsys.Setup(t)
	evs := events(5)
	for _, ev := range evs {
		env.Publish(t, ev)
	}
	c := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-1"})
	waitSettled(t, env, len(evs))
	c.Stop()

	rows := env.Rows(t)
	for i, ev := range evs {
		ch := onlyCharge(t, env, ev)
		if want := event.IdempotencyKey(ev.CustomerID, ev.BillingPeriod, teamsys.IdempotencyNamespace); ch.IdempotencyKey != want {
			t.Errorf("%s: charge idempotency key %q, want the article's content hash %q", ev.CustomerID, ch.IdempotencyKey, want)
		}
		if ch.Amount != ev.AmountCents || ch.Currency != "usd" || ch.Description != "Usage billing for "+period {
			t.Errorf("%s: charge %+v, want %d usd described as the article does", ev.CustomerID, ch, ev.AmountCents)
		}
		r := rows[i]
		if r.CustomerID != ev.CustomerID || r.BillingPeriod != period || r.ChargeID != ch.ID ||
			r.AmountCents != ev.AmountCents || r.Status != "charged" || r.Error != "" {
			t.Errorf("row %+v, want %s charged with %s", r, ev.CustomerID, ch.ID)
		}
	}
	if n := env.Sim.ChargeCreates(); n != int64(len(evs)) {
		t.Errorf("the emulator created %d charges, want %d", n, len(evs))
	}
	if n := env.Sim.Requests()["POST /v1/charges"]; n != int64(len(evs)) {
		t.Errorf("%d charge requests, want %d", n, len(evs))
	}
}

// A declined card is the article's permanent failure: a 'card_declined' row
// with no charge and the error text, and the entry acked rather than left
// for the monitor. The other events are billed as usual.
func TestConsumerRecordsCardDeclined(t *testing.T) {
	t.Parallel()
	env := teamsys.Setup(t)
	evs := events(3)
	declined := evs[1]
	if err := env.Sim.SetFaults(stripesim.Faults{DeclineCustomers: []string{declined.StripeCustomerID}}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		env.Publish(t, ev)
	}
	c := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer})
	waitSettled(t, env, len(evs))
	c.Stop()

	rows := env.Rows(t)
	r := rows[1]
	if r.CustomerID != declined.CustomerID || r.Status != "card_declined" || r.ChargeID != "" ||
		r.AmountCents != declined.AmountCents || !strings.Contains(r.Error, "Your card was declined.") {
		t.Errorf("declined row %+v, want card_declined, no charge id, the amount and the card error", r)
	}
	if chs := env.Charges(declined.StripeCustomerID, period); len(chs) != 0 {
		t.Errorf("%d succeeded charges for the declined customer, want 0", len(chs))
	}
	for _, i := range []int{0, 2} {
		if ch := onlyCharge(t, env, evs[i]); rows[i].Status != "charged" || rows[i].ChargeID != ch.ID {
			t.Errorf("row %+v, want charged with %s", rows[i], ch.ID)
		}
	}
	if n := env.Sim.ChargeCreates(); n != 3 {
		t.Errorf("the emulator created %d charges (one failed), want 3", n)
	}
}

// A consumer dies between Stripe's reply and its INSERT, and the team's
// naive monitor reclaims the entry. Within Stripe's 24 h idempotency window
// the content-hash key makes the reclaim get the same charge back; once the
// window has passed (the entry sat in the PEL for 25 h) the reclaim charges
// the customer a second time, and the table, which records only the second
// charge, shows nothing wrong. This double charge is what pelguard must
// prevent; the test shows the harness reproduces it.
func TestKilledConsumerThenMonitorReclaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		jump        time.Duration
		wantCharges int
	}{
		{name: "within the idempotency window the key returns the same charge", jump: 0, wantCharges: 1},
		{name: "after 25h the key is forgotten and the customer is charged twice", jump: 25 * time.Hour, wantCharges: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := teamsys.Setup(t)
			evs := events(2)
			billed, crashed := evs[0], evs[1]
			for _, ev := range evs {
				env.Publish(t, ev)
			}

			// The first event is billed, written and acked; the second is
			// charged and then the process is SIGKILLed before the INSERT.
			c := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-1", KillAfterCharges: 2})
			if exit := c.Wait(deadline); !exit.Killed() {
				t.Fatalf("the consumer ended with %s, want killed by SIGKILL after the second charge", exit)
			}
			first := onlyCharge(t, env, crashed)
			if rows := env.Rows(t); len(rows) != 1 || rows[0].CustomerID != billed.CustomerID {
				t.Fatalf("rows after the crash %+v, want only %s's", rows, billed.CustomerID)
			}
			if n := env.Pending(t); n != 1 {
				t.Fatalf("%d entries pending after the crash, want 1 (the charged, unrecorded one)", n)
			}

			env.Sim.Advance(tc.jump)
			m := env.Start(t, teamsys.Config{Role: teamsys.RoleMonitor, MinIdle: 5 * time.Millisecond, Interval: 20 * time.Millisecond})
			waitSettled(t, env, 2)
			m.Stop()

			onlyCharge(t, env, billed) // the monitor never saw the acked entry
			chs := env.Charges(crashed.StripeCustomerID, period)
			if len(chs) != tc.wantCharges {
				t.Fatalf("%s has %d succeeded charges, want %d: %+v", crashed.CustomerID, len(chs), tc.wantCharges, chs)
			}
			key := event.IdempotencyKey(crashed.CustomerID, period, teamsys.IdempotencyNamespace)
			for _, ch := range chs {
				if ch.IdempotencyKey != key {
					t.Errorf("charge %s has key %q, want the content hash %q", ch.ID, ch.IdempotencyKey, key)
				}
			}
			last := chs[len(chs)-1]
			rows := env.Rows(t)
			if r := rows[1]; r.CustomerID != crashed.CustomerID || r.Status != "charged" || r.ChargeID != last.ID {
				t.Errorf("row %+v, want %s charged with %s", r, crashed.CustomerID, last.ID)
			}
			if n := env.Sim.Requests()["POST /v1/charges"]; n != 3 {
				t.Errorf("%d charge requests, want 3 (two by the consumer, one by the monitor)", n)
			}
			if n := env.Sim.ChargeCreates(); n != int64(1+tc.wantCharges) {
				t.Errorf("the emulator created %d charges, want %d", n, 1+tc.wantCharges)
			}

			dups := env.Sim.Duplicates()
			if tc.wantCharges == 1 {
				if last.ID != first.ID || len(dups) != 0 {
					t.Errorf("the reclaim got %s (first was %s), duplicates %+v: want the same charge replayed", last.ID, first.ID, dups)
				}
				return
			}
			want := []string{first.ID, last.ID}
			if len(dups) != 1 || dups[0].Customer != crashed.StripeCustomerID || !slices.Equal(dups[0].ChargeIDs, want) {
				t.Errorf("duplicates %+v, want one group for %s with %v", dups, crashed.StripeCustomerID, want)
			}
			if strings.Contains(fmt.Sprint(rows), first.ID) {
				t.Errorf("rows %+v name the first charge %s; the team's table should have lost it", rows, first.ID)
			}
		})
	}
}
