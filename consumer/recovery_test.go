package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/importer"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// A ledger restored from a backup lost the row of a customer billed since:
// the charge is at Stripe, pelguard's, and its key was forgotten 25 h
// later. The runbook's recovery step (consumer import --from-stripe) puts
// the row back, and the re-published event is acked without a charge.
func TestLedgerRecoveryImportThenRepublish(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	e := ev(7)
	b.add(t, e)
	start(t, b.config(t, "before-the-restore"))
	testenv.Eventually(t, 20*time.Second, func() bool { return b.status(e) == ledger.StatusCharged && b.pending(t) == 0 }, "billed")
	// The restore: the row is gone.
	if _, err := b.pool.Exec(context.Background(), `DELETE FROM billing_records WHERE customer_id = $1`, e.CustomerID); err != nil {
		t.Fatal(err)
	}
	b.sim.Advance(25 * time.Hour)
	sum, err := importer.Run(context.Background(), importer.Config{DB: b.pool, Schema: testenv.SchemaOf(b.pool), Stripe: b.stripe,
		Namespace: "test", FromStripe: true, Period: e.BillingPeriod, Now: b.sim.Now})
	if err != nil || sum.ImportedCharged != 1 {
		t.Fatalf("import: %+v %v", sum, err)
	}
	b.add(t, e) // re-published
	start(t, b.config(t, "after-the-restore"))
	testenv.Eventually(t, 20*time.Second, func() bool { return b.pending(t) == 0 && b.status(e) == ledger.StatusCharged }, "acked")
	if n := b.charges(e); n != 1 {
		t.Fatalf("%d charges after the recovery, want 1", n)
	}
}

// An event whose occurred_at is older than the safe key window, with no
// ledger row: its first charge asks Stripe first and finds the charge a
// lost ledger row had recorded. Without occurred_at (the control) the same
// event is charged again.
func TestOldEventIsLookedUpBeforeItsFirstCharge(t *testing.T) {
	t.Parallel()
	for _, withTime := range []bool{true, false} {
		b := setup(t, opts{})
		e := ev(8)
		b.sim.SeedCharge(stripesim.ChargeSeed{Customer: e.StripeCustomerID, Amount: e.AmountCents, Created: b.sim.Now().Add(-48 * time.Hour),
			Metadata: stripeapi.PelguardMetadata(e.CustomerID, e.BillingPeriod, e.Key("test")), Description: "Usage billing for " + e.BillingPeriod})
		if withTime {
			e.OccurredAt = b.sim.Now().Add(-47 * time.Hour).UTC().Truncate(time.Second)
		}
		b.add(t, e)
		start(t, b.config(t, ""))
		testenv.Eventually(t, 20*time.Second, func() bool { return b.status(e) == ledger.StatusCharged && b.pending(t) == 0 }, "recorded")
		want := 1
		if !withTime {
			want = 2 // nothing told pelguard to look: the control
		}
		if n := b.charges(e); n != want {
			t.Fatalf("occurred_at=%v: %d charges, want %d", withTime, n, want)
		}
	}
}
