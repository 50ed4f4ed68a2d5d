package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// acme is issue 25's scenario: Stripe customer cus_acme pays for acme-eu
// (25.00, billed by pelguard, in the ledger) and acme-us (9.00, charged by
// the old consumer, which died before its INSERT: neither the ledger nor
// the stream knows acme-us). It returns pelguard's charge and acme-us's.
func (b *bundle) acme(t *testing.T, pelguardAt time.Time) (string, string) {
	t.Helper()
	eu := b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_acme", Amount: 2500, Created: pelguardAt,
		Metadata: stripeapi.PelguardMetadata("acme-eu", testPeriod, key("acme-eu"))}).ID
	us := b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_acme", Amount: 900, Created: at2, Description: legacyDesc}).ID
	r := row("acme-eu", 2500, eu, pelguardAt.Add(time.Second))
	r.StripeCustomerID = "cus_acme"
	b.seed(t, r)
	return eu, us
}

// `auditor --legacy --auto-refund` never refunds acme-us's only payment as a
// second charge of acme-eu: another amount is not acme-eu's duplicate,
// whether pelguard's charge is in the window (the legacy charge joins its
// group) or before it (compared with the ledger's row).
func TestLegacyChargeOfAnotherAmountIsNeverAnotherCustomersDuplicate(t *testing.T) {
	t.Parallel()
	for name, pelguardAt := range map[string]time.Time{"in the window": at1, "before the window": w0.Add(-48 * time.Hour)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			eu, us := b.acme(t, pelguardAt)
			a := b.auditor(t, func(c *Config) { c.Legacy, c.AutoRefund = true, true })
			rep, err := a.Run(context.Background(), Window{From: w0, To: w1})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.refunds(t); len(got) != 0 {
				t.Fatalf("refunded %+v: acme-us's only charge %s (or acme-eu's %s)", got, us, eu)
			}
			k := byKind(rep.Findings)
			if len(rep.Findings) != 1 || len(k[KindAmbiguousLegacy]) != 1 || k[KindAmbiguousLegacy][0].ChargeID != us ||
				k[KindAmbiguousLegacy][0].CustomerID != "" || k[KindAmbiguousLegacy][0].AmountCents != 900 {
				t.Fatalf("findings %+v, want only %s ambiguous_legacy with no customer", rep.Findings, us)
			}
			if rep.ExitCode() != 1 {
				t.Fatalf("exit %d with an open ambiguous_legacy finding", rep.ExitCode())
			}
		})
	}
}

// A duplicate finding an older auditor stored for acme-us's charge (before
// issue 25) is refused at refund time, and the next run resolves it.
func TestRefundRefusesALegacyDuplicateOfAnotherAmount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	eu, us := b.acme(t, at1)
	a := b.auditor(t, legacyMode)
	old := []Finding{{Kind: KindDuplicate, Subject: us, Legacy: true, CustomerID: "acme-eu", BillingPeriod: testPeriod,
		StripeCustomerID: "cus_acme", ChargeID: us, CanonicalChargeID: eu, AmountCents: 900, Currency: "usd",
		Detail: "legacy (unmarked) second charge for the period; canonical " + eu}}
	runID, err := a.store.startRun(ctx, Window{From: w0, To: w1}, true, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.insertFindings(ctx, runID, old); err != nil {
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Refunded) != 0 || len(rr.Skipped) != 1 || rr.Skipped[0].SkipCode != SkipAmountDiffers || len(b.refunds(t)) != 0 {
		t.Fatalf("refund of acme-us's charge as acme-eu's duplicate: %+v, emulator refunds %+v", rr, b.refunds(t))
	}
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Resolved) != 1 || rep.Resolved[0].ChargeID != us {
		t.Fatalf("resolved %+v, want the old duplicate of %s", rep.Resolved, us)
	}
}
