package audit

import (
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// b2bRow is an imported row of last period: the team's table maps cust to
// the shared Stripe customer cus_acme.
func b2bRow(cust, chargeID string, amount int64) ledger.Record {
	at := w0.Add(-40 * 24 * time.Hour)
	r := imported(cust, chargeID, at)
	r.BillingPeriod, r.StripeCustomerID, r.AmountCents = "2026-10", "cus_acme", amount
	return r
}

func (b *bundle) acmeLegacy(amount int64, at time.Time) string {
	return b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_acme", Amount: amount, Created: at, Description: legacyDesc}).ID
}

// Two team customers on one Stripe customer (the ledger's imported rows say
// so), one legacy charge each of the same amount: --legacy --auto-refund
// refunds nothing; the pair is reported ambiguous.
func TestLegacyTwoTeamCustomersOneStripeCustomerNothingRefunded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, b2bRow("acme-eu", "ch_old_eu", 2500), b2bRow("acme-us", "ch_old_us", 2500))
	b.acmeLegacy(2500, at1)
	second := b.acmeLegacy(2500, at2)
	a := b.auditor(t, func(c *Config) { c.Legacy, c.AutoRefund, c.MaxRefunds, c.MaxCents = true, true, 10, 100_000 })
	rep := b.run(t, a)
	if n := len(b.refunds(t)); n != 0 {
		t.Fatalf("%d refunds, want 0", n)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != KindAmbiguousLegacy || rep.Findings[0].ChargeID != second {
		t.Fatalf("findings %+v, want one ambiguous_legacy for %s", rep.Findings, second)
	}
	if got := b.refundAll(t, a); len(got) != 0 {
		t.Fatalf("refund --all refunded %v", got)
	}
}

// The stream maps two customers to one Stripe customer: pelguard charged
// acme-eu (marked), the old consumer acme-us (unmarked), one charge each.
// The legacy charge must not join acme-eu's group as its duplicate.
func TestLegacyStreamSharedStripeCustomerNotADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, b2bRow("acme-us", "ch_old_us", 2500))
	ours := b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_acme", Amount: 2500, Created: at1,
		Metadata: stripeapi.PelguardMetadata("acme-eu", testPeriod, key("acme-eu"))}).ID
	r := row("acme-eu", 2500, ours, at1.Add(time.Second))
	r.StripeCustomerID = "cus_acme"
	b.seed(t, r)
	b.acmeLegacy(2500, at2)
	a := b.auditor(t, func(c *Config) { c.Legacy, c.AutoRefund, c.MaxRefunds, c.MaxCents = true, true, 10, 100_000 })
	rep := b.run(t, a)
	if n := len(b.refunds(t)); n != 0 || len(byKind(rep.Findings)[KindDuplicate]) != 0 {
		t.Fatalf("%d refunds, findings %+v: want none", n, rep.Findings)
	}
}

// Amounts tell the customers apart only when this period's rows say what
// each owes: acme-eu 2500, acme-us 900 this period; two 2500 legacy charges
// are acme-eu's duplicate. With only last period's amounts it is no proof
// (a customer's amount changes): the same charges are ambiguous, never
// refunded.
func TestLegacySharedStripeCustomerToldApartByAmount(t *testing.T) {
	t.Parallel()
	for _, thisPeriod := range []bool{true, false} {
		b := setup(t)
		eu, us := b2bRow("acme-eu", "ch_old_eu", 2500), b2bRow("acme-us", "ch_old_us", 900)
		if thisPeriod {
			eu.BillingPeriod, us.BillingPeriod = testPeriod, testPeriod
			eu.ChargeID, us.ChargeID = "", ""
			eu.Status, us.Status = ledger.StatusDeclined, ledger.StatusDeclined
		}
		b.seed(t, eu, us)
		b.acmeLegacy(2500, at1)
		b.acmeLegacy(900, at1.Add(time.Minute))
		dup := b.acmeLegacy(2500, at2)
		rep := b.run(t, b.auditor(t, legacyMode))
		if len(rep.Findings) != 1 {
			t.Fatalf("this period=%v: findings %+v", thisPeriod, rep.Findings)
		}
		f := rep.Findings[0]
		switch {
		case thisPeriod && (f.Kind != KindDuplicate || f.ChargeID != dup || f.CustomerID != "acme-eu" || !f.Legacy):
			t.Fatalf("finding %+v, want %s acme-eu's duplicate", f, dup)
		case !thisPeriod && f.Kind != KindAmbiguousLegacy:
			t.Fatalf("last period's amounts only: finding %+v, want ambiguous_legacy", f)
		}
	}
}
