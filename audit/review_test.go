package audit

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

func (b *bundle) run(t *testing.T, a *Auditor) Report {
	t.Helper()
	rep, err := a.Run(context.Background(), Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// Late ledger write: the first run sees pelguard's charge before the
// consumer's ledger write (an orphan); the write lands; the next run
// resolves the orphan by itself, naming the run and why, and the refund
// command refuses it. Nothing is refunded.
func TestLateLedgerWriteResolvesTheOrphan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ch := b.charge("late", 2500, w0.Add(time.Hour), 0)
	a := b.auditor(t, nil)
	rep := b.run(t, a)
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != KindOrphan || rep.Findings[0].State != StateOpen {
		t.Fatalf("first run: %+v, want one open orphan", rep.Findings)
	}
	orphan := rep.Findings[0]

	b.seed(t, row("late", 2500, ch, w0.Add(time.Hour+time.Minute)))
	rep = b.run(t, a)
	if len(rep.Findings) != 0 || rep.OpenFindings != 0 {
		t.Fatalf("second run detected %+v", rep.Findings)
	}
	if len(rep.Resolved) != 1 || rep.Resolved[0].ID != orphan.ID {
		t.Fatalf("resolved %+v, want the orphan %d", rep.Resolved, orphan.ID)
	}
	got, err := a.Store().Get(ctx, orphan.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateResolved || got.ResolvedByRunID != rep.RunID || got.Resolution == "" {
		t.Fatalf("stored orphan %+v, want resolved by run %d with a reason", got, rep.RunID)
	}
	if _, err := a.Refund(ctx, RefundOptions{FindingID: orphan.ID}); !errors.Is(err, ErrState) {
		t.Fatalf("refunding the resolved orphan: %v, want ErrState", err)
	}
	if _, err := a.Refund(ctx, RefundOptions{MaxRefunds: 10, MaxCents: 100_000}); err != nil {
		t.Fatal(err)
	}
	if n := len(b.refunds(t)); n != 0 {
		t.Fatalf("%d refunds, want 0", n)
	}
	// A third run changes nothing: resolved stays resolved.
	rep = b.run(t, a)
	if len(rep.Resolved) != 0 || len(rep.Findings) != 0 {
		t.Fatalf("third run: findings %+v, resolved %+v", rep.Findings, rep.Resolved)
	}
}

// Late ledger write naming the second charge: the orphan (first charge)
// and the duplicate (second, "of" the first) both go; the first becomes
// the duplicate of the ledger's charge, and only it is refunded.
func TestLateLedgerWriteOfTheOtherChargeSwapsTheDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.charge("swap", 2500, w0.Add(time.Hour), 0)
	second := b.charge("swap", 2500, w0.Add(2*time.Hour), 0)
	a := b.auditor(t, nil)
	rep := b.run(t, a)
	k := byKind(rep.Findings)
	if len(k[KindOrphan]) != 1 || len(k[KindDuplicate]) != 1 || k[KindDuplicate][0].ChargeID != second {
		t.Fatalf("first run: %+v", rep.Findings)
	}
	b.seed(t, row("swap", 2500, second, w0.Add(2*time.Hour+time.Minute)))
	rep = b.run(t, a)
	k = byKind(rep.Findings)
	if len(rep.Findings) != 1 || len(k[KindDuplicate]) != 1 || k[KindDuplicate][0].ChargeID != first ||
		k[KindDuplicate][0].CanonicalChargeID != second {
		t.Fatalf("second run: %+v, want %s a duplicate of %s", rep.Findings, first, second)
	}
	if len(rep.Resolved) != 2 {
		t.Fatalf("resolved %+v, want the orphan and the old duplicate", rep.Resolved)
	}
	if got := b.refundAll(t, a); len(got) != 1 || got[0] != first {
		t.Fatalf("refunded %v, want only %s", got, first)
	}
}

// A missing charge that appears: the ledger recorded a PaymentIntent whose
// charge Stripe did not list yet; once listed, the finding resolves.
func TestMissingChargeThatAppearsResolves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := w0.Add(time.Hour)
	b.seed(t, row("slow", 2500, "pi_slow", at))
	a := b.auditor(t, nil)
	rep := b.run(t, a)
	if k := byKind(rep.Findings); len(rep.Findings) != 1 || len(k[KindMissing]) != 1 {
		t.Fatalf("first run: %+v, want one missing", rep.Findings)
	}
	missing := rep.Findings[0]
	b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_slow", Amount: 2500, Created: at.Add(-time.Minute),
		PaymentIntent: "pi_slow", Metadata: stripeapi.PelguardMetadata("slow", testPeriod, key("slow"))})
	rep = b.run(t, a)
	if len(rep.Findings) != 0 || len(rep.Resolved) != 1 || rep.Resolved[0].ID != missing.ID {
		t.Fatalf("second run: findings %+v, resolved %+v", rep.Findings, rep.Resolved)
	}
	got, _ := a.Store().Get(context.Background(), missing.ID)
	if got.State != StateResolved || got.ResolvedByRunID != rep.RunID {
		t.Fatalf("stored %+v", got)
	}
}

// A duplicate refunded by hand at Stripe resolves (not "refunded": pelguard
// did not refund it), and a dismissed finding stays dismissed.
func TestDuplicateRefundedElsewhereResolvesDismissedStays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	canon := b.charge("hand", 2500, w0.Add(time.Hour), 0)
	b.seed(t, row("hand", 2500, canon, w0.Add(time.Hour+time.Minute)))
	dup := b.charge("hand", 2500, w0.Add(2*time.Hour), 0)
	canon2 := b.charge("dis", 2500, w0.Add(time.Hour), 0)
	b.seed(t, row("dis", 2500, canon2, w0.Add(time.Hour+time.Minute)))
	b.charge("dis", 2500, w0.Add(2*time.Hour), 0)
	a := b.auditor(t, nil)
	rep := b.run(t, a)
	if len(rep.Findings) != 2 {
		t.Fatalf("first run: %+v", rep.Findings)
	}
	var dupID, disID int64
	for _, f := range rep.Findings {
		if f.ChargeID == dup {
			dupID = f.ID
		} else {
			disID = f.ID
		}
	}
	if _, err := a.Store().Dismiss(ctx, disID); err != nil {
		t.Fatal(err)
	}
	// Refunded by hand: the emulator's seed of the same charge is not
	// possible, so refund through the adapter as a person would in the
	// Dashboard (a refund pelguard did not record).
	sc, err := stripeapi.New(b.cfg.Stripe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Refund(ctx, dup, 0, "by-hand-"+dup); err != nil {
		t.Fatal(err)
	}
	rep = b.run(t, a)
	if len(rep.Resolved) != 1 || rep.Resolved[0].ID != dupID {
		t.Fatalf("resolved %+v, want the duplicate refunded by hand", rep.Resolved)
	}
	if got, _ := a.Store().Get(ctx, disID); got.State != StateDismissed {
		t.Fatalf("dismissed finding is now %+v", got)
	}
	if got, _ := a.Store().Get(ctx, dupID); got.State != StateResolved || got.RefundID != "" {
		t.Fatalf("duplicate %+v", got)
	}
}

// A disputed pelguard charge is one disputed finding, found once.
func TestDisputedChargeIsOneFinding(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := w0.Add(time.Hour)
	ch := b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_dsp", Amount: 2500, Created: at, Disputed: true,
		Metadata: stripeapi.PelguardMetadata("dsp", testPeriod, key("dsp"))}).ID
	b.seed(t, row("dsp", 2500, ch, at.Add(time.Minute)))
	a := b.auditor(t, nil)
	for i := range 2 {
		rep := b.run(t, a)
		if len(rep.Findings) != 1 {
			t.Fatalf("run %d: %+v, want one disputed finding", i, rep.Findings)
		}
		f := rep.Findings[0]
		if f.Kind != KindDisputed || f.ChargeID != ch || f.CustomerID != "dsp" || f.State != StateOpen || f.New != (i == 0) {
			t.Fatalf("run %d: %+v", i, f)
		}
	}
	if _, err := a.Refund(context.Background(), RefundOptions{MaxRefunds: 10, MaxCents: 100_000}); err != nil {
		t.Fatal(err)
	}
	if n := len(b.refunds(t)); n != 0 {
		t.Fatalf("%d refunds of a disputed charge, want 0", n)
	}
}

// decide never resolves on absence alone, nor across modes.
func TestDecideNeedsProof(t *testing.T) {
	t.Parallel()
	dup := Finding{Kind: KindDuplicate, Subject: "ch_d", ChargeID: "ch_d", CanonicalChargeID: "ch_c", CustomerID: "c", BillingPeriod: "p"}
	legacyDup := dup
	legacyDup.Legacy = true
	orphan := Finding{Kind: KindOrphan, Subject: "ch_o", ChargeID: "ch_o", CustomerID: "c", BillingPeriod: "p"}
	charged := ledger.Record{Key: ledger.Key{CustomerID: "c", BillingPeriod: "p"}, Status: ledger.StatusCharged, ChargeID: "ch_o"}
	cases := []struct {
		name    string
		r       review
		f       Finding
		resolve bool
	}{
		{"duplicate not listed", review{}, dup, false},
		{"duplicate listed, still holding money", review{seen: map[string]fact{"ch_d": {net: 2500}}}, dup, false},
		{"duplicate refunded", review{seen: map[string]fact{"ch_d": {net: 0}}}, dup, true},
		{"legacy duplicate, run without --legacy", review{seen: map[string]fact{"ch_d": {net: 0}}}, legacyDup, false},
		{"canonical refunded", review{seen: map[string]fact{"ch_d": {net: 2500}, "ch_c": {net: 0}}}, dup, true},
		{"canonical refunded, still detected", review{seen: map[string]fact{"ch_d": {net: 2500}, "ch_c": {net: 0}},
			detected: map[findingKey]bool{{KindDuplicate, "ch_d"}: true}}, dup, false},
		{"other period", review{period: "q", seen: map[string]fact{"ch_d": {net: 0}}}, dup, false},
		{"orphan not listed", review{}, orphan, false},
		{"orphan recorded", review{recorded: map[string]ledger.Record{"ch_o": charged}}, orphan, true},
		{"orphan's key charged with another, not listed", review{rows: map[ledger.Key]ledger.Record{charged.Key: {Status: ledger.StatusCharged, ChargeID: "ch_x"}}}, orphan, false},
	}
	for _, tc := range cases {
		if got := tc.r.decide(tc.f) != ""; got != tc.resolve {
			t.Errorf("%s: resolved=%v, want %v (%q)", tc.name, got, tc.resolve, tc.r.decide(tc.f))
		}
	}
}

// The canonical refunded by hand, three charges, no ledger row: the next
// run makes the second charge canonical, resolves its duplicate finding,
// points the third's open finding at the new canonical (not a new
// finding), and a refund run refunds only the third.
func TestCanonicalRefundedElsewhereMovesTheOpenDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := b.charge("three", 2500, w0.Add(time.Hour), 0)
	second := b.charge("three", 2500, w0.Add(2*time.Hour), 0)
	third := b.charge("three", 2500, w0.Add(3*time.Hour), 0)
	a := b.auditor(t, nil)
	rep := b.run(t, a)
	if k := byKind(rep.Findings); len(k[KindDuplicate]) != 2 || len(k[KindOrphan]) != 1 {
		t.Fatalf("first run: %+v", rep.Findings)
	}
	sc, err := stripeapi.New(b.cfg.Stripe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Refund(ctx, first, 0, "by-hand-"+first); err != nil {
		t.Fatal(err)
	}
	rep = b.run(t, a)
	k := byKind(rep.Findings)
	if len(k[KindDuplicate]) != 1 || k[KindDuplicate][0].ChargeID != third || k[KindDuplicate][0].CanonicalChargeID != second ||
		k[KindDuplicate][0].New {
		t.Fatalf("second run duplicates %+v, want the known %s now against %s", k[KindDuplicate], third, second)
	}
	stored, _ := a.Store().Get(ctx, k[KindDuplicate][0].ID)
	if stored.CanonicalChargeID != second {
		t.Fatalf("stored canonical %s, want %s", stored.CanonicalChargeID, second)
	}
	resolved := map[string]bool{}
	for _, f := range rep.Resolved {
		resolved[f.Subject] = true
	}
	if len(rep.Resolved) != 2 || !resolved[first] || !resolved[second] {
		t.Fatalf("resolved %+v, want the orphan %s and the duplicate %s", rep.Resolved, first, second)
	}
	if got := b.refundAll(t, a); len(got) != 2 || !slices.Contains(got, third) || !slices.Contains(got, first) {
		// first's refund is the hand-made one.
		t.Fatalf("refunds %v, want the hand refund of %s and pelguard's of %s", got, first, third)
	}
	if ch, _ := b.sim.Charge(second); ch.AmountRefunded != 0 {
		t.Fatalf("the new canonical %s was refunded", second)
	}
}

// Every kind of Kinds is one the table accepts (00006 extended the CHECK),
// and a finding the table holds resolved by hand names no run.
func TestEveryKindIsStorable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a := b.auditor(t, nil)
	runID, err := a.store.startRun(ctx, Window{From: w0, To: w1}, true, now)
	if err != nil {
		t.Fatal(err)
	}
	var fs []Finding
	for _, k := range Kinds {
		fs = append(fs, Finding{Kind: k, Subject: "s_" + string(k), ChargeID: "ch_" + string(k)})
	}
	if err := a.store.insertFindings(ctx, runID, fs); err != nil {
		t.Fatalf("storing one finding of each kind: %v", err)
	}
	got, err := a.Store().Resolve(ctx, fs[0].ID)
	if err != nil || got.State != StateResolved || got.ResolvedByRunID != 0 || got.Resolution != "" {
		t.Fatalf("resolved by hand: %+v %v", got, err)
	}
}
