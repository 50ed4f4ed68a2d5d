package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// debit seeds a bank debit of cust made by a PaymentIntent, pending until
// settled (stripesim.Settle), and returns the charge id.
func (b *bundle) debit(cust string, created time.Time, md map[string]string) string {
	if md == nil {
		md = stripeapi.PelguardMetadata(cust, testPeriod, key(cust))
	}
	return b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_" + cust, Amount: 2500, Created: created,
		Status: "pending", ViaIntent: true, Metadata: md}).ID
}

// processing is a ledger row of cust waiting for its pending charge.
func processing(cust, chargeID string, at time.Time) ledger.Record {
	r := row(cust, 2500, chargeID, at)
	r.Status, r.ChargedAt = ledger.StatusProcessing, time.Time{}
	return r
}

func (b *bundle) settle(t *testing.T, cust, chargeID string, succeeded bool) {
	t.Helper()
	if err := b.sim.Settle(chargeID, succeeded, ""); err != nil {
		t.Fatal(err)
	}
	_, err := b.ledger.Settle(context.Background(), ledger.Key{CustomerID: cust, BillingPeriod: testPeriod},
		ledger.Settlement{ChargeID: chargeID, Succeeded: succeeded, FailureCode: "insufficient_funds", Error: "insufficient funds"})
	if err != nil {
		t.Fatal(err)
	}
}

// Money in motion (issue 21): a pending debit is neither missing nor an
// orphan while its row is processing, and it is not forgotten: every later
// run reads it again until it is final, then judges it as if its window had
// listed it. A debit that settles days later, with its row now charged in
// a later window, is fine; a second pending debit of the same key becomes a
// duplicate once it succeeded; a failed one is dropped. A failed attempt-1
// charge and a succeeded attempt-2 charge (same base key in metadata) are
// not a duplicate: failed charges never count.
func TestPendingDebitsAreFollowedUntilFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := w0.Add(2 * time.Hour)

	alice := b.debit("alice", at, nil)
	bob1 := b.debit("bob", at, nil)
	bob2 := b.debit("bob", at.Add(25*time.Hour-time.Minute), nil) // a takeover past 24 h debited again
	dave := b.debit("dave", at, nil)
	// carol: attempt 1 declined (insufficient_funds), attempt 2 charged.
	b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_carol", Amount: 2500, Created: at, Status: "failed",
		Metadata: stripeapi.PelguardMetadata("carol", testPeriod, key("carol"))})
	md2 := stripeapi.PelguardMetadata("carol", testPeriod, key("carol"))
	md2["attempt"] = "2"
	carol2 := b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_carol", Amount: 2500, Created: at.Add(2 * time.Hour), Metadata: md2}).ID
	b.seed(t, processing("alice", alice, at.Add(time.Second)), processing("bob", bob1, at.Add(time.Second)),
		processing("dave", dave, at.Add(time.Second)), row("carol", 2500, carol2, at.Add(2*time.Hour+time.Second)))

	a := b.auditor(t, nil)
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 || rep.PendingCharges != 3 {
		t.Fatalf("day 0: findings %+v, %d pending followed; want none and 3 (alice, bob, dave)", rep.Findings, rep.PendingCharges)
	}

	// Three days later: alice's and bob's first debits succeed and the
	// ledger records them (charged_at now: a later window); dave's fails.
	b.clk.Advance(72 * time.Hour)
	b.settle(t, "alice", alice, true)
	b.settle(t, "bob", bob1, true)
	b.settle(t, "dave", dave, false)
	from2, to2 := w1, b.clk.Now().Add(time.Hour)
	rep, err = a.Run(ctx, Window{From: from2, To: to2})
	if err != nil {
		t.Fatal(err)
	}
	// bob2 was listed here (created within the window, still pending).
	if len(rep.Findings) != 0 || rep.PendingRechecked != 3 || rep.PendingCharges != 1 {
		t.Fatalf("day 3: findings %+v, %d rechecked, %d followed; want none, 3, 1 (bob's second debit)",
			rep.Findings, rep.PendingRechecked, rep.PendingCharges)
	}

	// bob's second debit succeeds too: a second charge for bob's period.
	if err := b.sim.Settle(bob2, true, ""); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(24 * time.Hour)
	rep, err = a.Run(ctx, Window{From: to2, To: to2.Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	k := byKind(rep.Findings)
	if len(rep.Findings) != 1 || len(k[KindDuplicate]) != 1 || k[KindDuplicate][0].ChargeID != bob2 ||
		k[KindDuplicate][0].CanonicalChargeID != bob1 || rep.PendingCharges != 0 {
		t.Fatalf("day 4: findings %+v, %d followed; want %s a duplicate of %s and nothing followed", rep.Findings, rep.PendingCharges, bob2, bob1)
	}
	// Nothing left to follow: a rerun reads nothing again, and the
	// duplicate stays open for `auditor refund`.
	rep, err = a.Run(ctx, Window{From: to2, To: to2.Add(24 * time.Hour)})
	if err != nil || rep.PendingRechecked != 0 || rep.NewFindings != 0 {
		t.Fatalf("rerun: %v, %d rechecked, findings %+v", err, rep.PendingRechecked, rep.Findings)
	}
	open, err := a.Store().Findings(ctx, Filter{Kind: KindDuplicate, State: StateOpen})
	if err != nil || len(open) != 1 || open[0].ChargeID != bob2 {
		t.Fatalf("open duplicates %+v (%v), want %s", open, err, bob2)
	}
}

// A row the ledger marked charged with a charge that was still pending (an
// older consumer recorded a debit charged at once): not missing while the
// charge is pending; missing_charge once the bank says it failed, though
// its window is long past.
func TestChargedRowOfAFailedDebitIsMissingOnceFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := w0.Add(2 * time.Hour)
	id := b.debit("erin", at, nil)
	b.seed(t, row("erin", 2500, id, at.Add(time.Second)))
	a := b.auditor(t, nil)
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil || len(rep.Findings) != 0 || rep.PendingCharges != 1 {
		t.Fatalf("pending: %v, findings %+v, %d followed; want none, 1", err, rep.Findings, rep.PendingCharges)
	}
	if err := b.sim.Settle(id, false, "account_closed"); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(72 * time.Hour)
	// Another period's run neither judges nor forgets it.
	rep, err = a.Run(ctx, Window{From: w1, To: b.clk.Now().Add(-time.Hour), Period: "2026-10"})
	if err != nil || len(rep.Findings) != 0 || rep.PendingRechecked != 0 || rep.PendingCharges != 1 {
		t.Fatalf("--period 2026-10: %v, findings %+v, %d rechecked, %d followed; want none, 0, 1", err, rep.Findings, rep.PendingRechecked, rep.PendingCharges)
	}
	rep, err = a.Run(ctx, Window{From: w1, To: b.clk.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if k := byKind(rep.Findings); len(rep.Findings) != 1 || len(k[KindMissing]) != 1 || k[KindMissing][0].ChargeID != id || rep.PendingCharges != 0 {
		t.Fatalf("failed: findings %+v, %d followed; want one missing_charge for %s", rep.Findings, rep.PendingCharges, id)
	}
}

// The bank confirmed the debit before the ledger heard of it (the poll or
// webhook is still to come): the succeeded charge is the processing row's
// charge, not an orphan; a second succeeded charge is its duplicate.
func TestSettledDebitOfAProcessingRowIsItsCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := w0.Add(2 * time.Hour)
	id := b.debit("frank", at, nil)
	if err := b.sim.Settle(id, true, ""); err != nil {
		t.Fatal(err)
	}
	dup := b.charge("frank", 2500, at.Add(time.Hour), 0)
	b.seed(t, processing("frank", id, at.Add(time.Second)))
	rep, err := b.auditor(t, nil).Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if k := byKind(rep.Findings); len(rep.Findings) != 1 || len(k[KindDuplicate]) != 1 || k[KindDuplicate][0].ChargeID != dup ||
		k[KindDuplicate][0].CanonicalChargeID != id {
		t.Fatalf("findings %+v, want only %s a duplicate of the processing row's %s", rep.Findings, dup, id)
	}
}
