package audit

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// world is a seeded window with every finding kind and clean look-alikes.
type world struct {
	dup, partial, late       string // duplicates to find
	dupCanon, partialCanon   string
	lateCanon                string
	orphan, orphanPending    string
	mismatch                 string
	missingKey, stuckKey     string
	refundedDup, canonRefund string // look-alikes: nothing to find
}

func (b *bundle) world(t testing.TB) world {
	t.Helper()
	in := func(h int) time.Time { return w0.Add(time.Duration(h) * time.Hour) }
	var w world
	var recs []ledger.Record

	// Clean: one charge, recorded; a failed attempt beside it is no charge.
	a1 := b.charge("clean", 2500, in(1), 0)
	b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_clean", Amount: 2500, Created: in(1), Status: "failed",
		Metadata: map[string]string{"pelguard": "1", "customer_id": "clean", "billing_period": testPeriod}})
	recs = append(recs, row("clean", 2500, a1, in(1).Add(time.Second)))

	// Duplicate: the ledger's charge and a second one.
	w.dupCanon = b.charge("dup", 2500, in(2), 0)
	w.dup = b.charge("dup", 2500, in(3), 0)
	recs = append(recs, row("dup", 2500, w.dupCanon, in(2).Add(time.Second)))

	// Partly refunded duplicate: still a duplicate, for the remainder.
	w.partialCanon = b.charge("partial", 2500, in(2), 0)
	w.partial = b.charge("partial", 2500, in(4), 1000)
	recs = append(recs, row("partial", 2500, w.partialCanon, in(2).Add(time.Second)))

	// Fully refunded duplicate: already undone, not a finding.
	r1 := b.charge("refdup", 2500, in(2), 0)
	w.refundedDup = b.charge("refdup", 2500, in(5), 2500)
	recs = append(recs, row("refdup", 2500, r1, in(2).Add(time.Second)))

	// Refunded canonical charge with one other standing: paid once.
	k1 := b.charge("canonref", 2500, in(2), 2500)
	w.canonRefund = b.charge("canonref", 2500, in(6), 0)
	recs = append(recs, row("canonref", 2500, k1, in(2).Add(time.Second)))

	// A redelivery a day later: the ledger's charge is before the window.
	w.lateCanon = b.charge("late", 2500, w0.Add(-26*time.Hour), 0)
	w.late = b.charge("late", 2500, in(7), 0)
	recs = append(recs, row("late", 2500, w.lateCanon, w0.Add(-26*time.Hour+time.Second)))

	// Orphans: no ledger row; a row still pending (with a live lease).
	w.orphan = b.charge("orphan", 2500, in(8), 0)
	w.orphanPending = b.charge("opending", 2500, in(8), 0)
	op := row("opending", 2500, "", now)
	op.LeaseOwner, op.LeaseExpiresAt = "consumer-1", now.Add(time.Minute)
	recs = append(recs, op)

	// Missing: the ledger says charged; Stripe never heard of it.
	w.missingKey = key("missing")
	recs = append(recs, row("missing", 2500, "ch_not_at_stripe", in(9)))

	// Amount mismatch.
	w.mismatch = b.charge("mismatch", 3000, in(10), 0)
	recs = append(recs, row("mismatch", 2500, w.mismatch, in(10).Add(time.Second)))

	// Stuck pending: no lease, untouched for two hours.
	w.stuckKey = key("stuck")
	recs = append(recs, row("stuck", 2500, "", now.Add(-2*time.Hour)))

	// Unmarked (the old consumer's) duplicates: ignored without --legacy.
	for range 2 {
		b.sim.SeedCharge(stripesim.ChargeSeed{Customer: "cus_naive", Amount: 2500, Created: in(11),
			Description: "Usage billing for " + testPeriod})
	}
	// Just outside the window: a duplicate created at w1 (excluded) and a
	// pair created before the listing starts.
	x1 := b.charge("edge", 2500, in(12), 0)
	b.charge("edge", 2500, w1, 0)
	recs = append(recs, row("edge", 2500, x1, in(12).Add(time.Second)))
	o1 := b.charge("old", 2500, w0.Add(-DefaultChargeLag-time.Second), 0)
	b.charge("old", 2500, w0.Add(-DefaultChargeLag-time.Second), 0)
	recs = append(recs, row("old", 2500, o1, w0.Add(-DefaultChargeLag)))

	b.seed(t, recs...)
	return w
}

func subjects(fs []Finding) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Subject
	}
	return out
}

func sameSet(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	m := map[string]int{}
	for _, s := range got {
		m[s]++
	}
	for _, s := range want {
		if m[s] == 0 {
			return false
		}
		m[s]--
	}
	return true
}

func TestRunFindsExactlyTheSeededFindings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.world(t)
	a := b.auditor(t, nil)
	ctx := context.Background()

	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	got := byKind(rep.Findings)
	want := map[Kind][]string{
		KindDuplicate:      {w.dup, w.partial, w.late},
		KindOrphan:         {w.orphan, w.orphanPending},
		KindMissing:        {w.missingKey},
		KindAmountMismatch: {w.mismatch},
		KindStuckPending:   {w.stuckKey},
	}
	for k, subs := range want {
		if !sameSet(subjects(got[k]), subs) {
			t.Errorf("%s: got %v, want %v", k, subjects(got[k]), subs)
		}
	}
	if len(rep.Findings) != 8 || rep.NewFindings != 8 || rep.OpenFindings != 8 || rep.ExitCode() != 1 {
		t.Fatalf("findings %d new %d open %d exit %d; want 8/8/8/1", len(rep.Findings), rep.NewFindings, rep.OpenFindings, rep.ExitCode())
	}
	for _, f := range got[KindDuplicate] {
		switch f.Subject {
		case w.partial:
			if f.AmountCents != 1500 || f.CanonicalChargeID != w.partialCanon {
				t.Errorf("partly refunded duplicate: amount %d canonical %s", f.AmountCents, f.CanonicalChargeID)
			}
		case w.dup:
			if f.CanonicalChargeID != w.dupCanon || f.AmountCents != 2500 || f.CustomerID != "dup" {
				t.Errorf("duplicate: %+v", f)
			}
		case w.late:
			if f.CanonicalChargeID != w.lateCanon {
				t.Errorf("late duplicate canonical %s, want the ledger's %s", f.CanonicalChargeID, w.lateCanon)
			}
		}
	}
	// 17 = every charge in [w0-ChargeLag, w1): the pair before it and the
	// duplicate at w1 are outside.
	if rep.ChargesScanned != 17 || rep.Pages < 1 || rep.LedgerCharged != 8 {
		t.Errorf("scanned %d pages %d ledger %d", rep.ChargesScanned, rep.Pages, rep.LedgerCharged)
	}

	// One alert with the new findings and the exact refund command.
	as := b.mem.Alerts()
	if len(as) != 1 || !strings.Contains(as[0].Title, "8 new findings") ||
		as[0].Command != "pelguard-auditor refund --all --max-refunds 3 --max-cents 6500" {
		t.Fatalf("alerts: %+v", as)
	}

	// A rerun adds nothing and does not alert again.
	rep2, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep2.Findings) != 8 || rep2.NewFindings != 0 || len(b.mem.Alerts()) != 1 {
		t.Fatalf("rerun: %d findings, %d new, %d alerts", len(rep2.Findings), rep2.NewFindings, len(b.mem.Alerts()))
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM audit_findings`).Scan(&n); err != nil || n != 8 {
		t.Fatalf("audit_findings has %d rows (%v)", n, err)
	}

	// A resolved finding stays resolved.
	mm := got[KindAmountMismatch][0]
	if _, err := a.Store().Resolve(ctx, mm.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Store().Dismiss(ctx, mm.ID); !errors.Is(err, ErrState) {
		t.Fatalf("dismissing a resolved finding: %v", err)
	}
	rep3, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if rep3.OpenFindings != 7 || rep3.NewFindings != 0 {
		t.Fatalf("after resolve: open %d new %d", rep3.OpenFindings, rep3.NewFindings)
	}
	if f, _ := a.Store().Get(ctx, mm.ID); f.State != StateResolved {
		t.Fatalf("resolved finding is now %s", f.State)
	}
	open, err := a.Store().Findings(ctx, Filter{State: StateOpen, Kind: KindDuplicate, Period: testPeriod})
	if err != nil || len(open) != 3 {
		t.Fatalf("open duplicates: %d %v", len(open), err)
	}
}

func TestLegacyFindsTheNaiveConsumersDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := w0.Add(time.Hour)
	naive := func(cust, desc string, refunded int64, md map[string]string) string {
		return b.sim.SeedCharge(stripesim.ChargeSeed{Customer: cust, Amount: 2500, Created: at, Description: desc,
			AmountRefunded: refunded, Metadata: md}).ID
	}
	desc := "Usage billing for " + testPeriod
	naive("cus_1", desc, 0, nil)
	d1 := naive("cus_1", desc, 0, nil)
	naive("cus_2", desc, 0, nil)
	naive("cus_3", desc, 0, nil)
	naive("cus_3", desc, 2500, nil) // refunded already
	d3 := naive("cus_3", desc, 0, nil)
	naive("cus_1", "Usage billing for 2026-10", 0, nil) // another period
	naive("cus_4", "Something else", 0, nil)
	naive("cus_4", "Something else", 0, nil) // no period: ignored
	naive("cus_5", "", 0, map[string]string{"billing_period": testPeriod})
	d5 := naive("cus_5", "", 0, map[string]string{"billing_period": testPeriod})

	ctx := context.Background()
	plain, err := b.auditor(t, nil).Run(ctx, Window{From: w0, To: w1})
	if err != nil || len(plain.Findings) != 0 || plain.ExitCode() != 0 {
		t.Fatalf("without --legacy: %d findings, %v", len(plain.Findings), err)
	}
	rep, err := b.auditor(t, legacyMode).Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if !sameSet(subjects(rep.Findings), []string{d1, d3, d5}) {
		t.Fatalf("legacy findings %v, want %v", subjects(rep.Findings), []string{d1, d3, d5})
	}
	want := 0
	for _, g := range b.sim.Duplicates() {
		want += len(g.ChargeIDs) - 1
	}
	if want != 3 {
		t.Fatalf("the emulator counts %d duplicates", want)
	}
	for _, f := range rep.Findings {
		if !f.Legacy || f.Kind != KindDuplicate || f.CanonicalChargeID == "" || f.CanonicalChargeID == f.ChargeID {
			t.Errorf("legacy finding %+v", f)
		}
	}
}

func TestRefundEachDuplicateOnceNeverTheCanonical(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.world(t)
	a := b.auditor(t, nil)
	ctx := context.Background()
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Refunded) != 3 || rr.RefundedCents != 6500 || rr.StoppedBy != "" {
		t.Fatalf("refund report %+v", rr)
	}
	refunds := b.refunds(t)
	if len(refunds) != 3 {
		t.Fatalf("%d refunds at Stripe, want 3", len(refunds))
	}
	for _, r := range refunds {
		if r.Reason != "duplicate" {
			t.Errorf("refund %s reason %q", r.ID, r.Reason)
		}
		if r.Charge == w.dupCanon || r.Charge == w.partialCanon || r.Charge == w.lateCanon {
			t.Errorf("canonical charge %s refunded", r.Charge)
		}
	}
	for _, id := range []string{w.dup, w.partial, w.late} {
		if ch, _ := b.sim.Charge(id); !ch.Refunded {
			t.Errorf("duplicate %s not fully refunded: %+v", id, ch)
		}
	}
	for _, id := range []string{w.dupCanon, w.partialCanon, w.lateCanon} {
		if ch, _ := b.sim.Charge(id); ch.AmountRefunded != 0 {
			t.Errorf("canonical %s refunded %d", id, ch.AmountRefunded)
		}
	}
	fs, _ := a.Store().Findings(ctx, Filter{Kind: KindDuplicate})
	for _, f := range fs {
		if f.State != StateRefunded || f.RefundID == "" {
			t.Errorf("finding %d: state %s refund %q", f.ID, f.State, f.RefundID)
		}
	}
	// A second refund run does nothing, and the emulator saw no request.
	before := b.sim.Requests()["POST /v1/refunds"]
	rr2, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
	if err != nil || len(rr2.Refunded) != 0 || b.sim.Requests()["POST /v1/refunds"] != before {
		t.Fatalf("second refund run: %+v %v", rr2, err)
	}
	// A rerun of the audit finds the duplicates refunded: nothing open.
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil || byKind(rep.Findings)[KindDuplicate] != nil {
		t.Fatalf("after refunds the audit still sees duplicates: %v %v", subjects(rep.Findings), err)
	}
}

func TestRefundCapsStopTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	a := b.auditor(t, nil)
	ctx := context.Background()
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	dry, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000, DryRun: true})
	if err != nil || len(dry.Refunded) != 3 || len(b.refunds(t)) != 0 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 2, MaxCents: 1_000_000})
	if err != nil || len(rr.Refunded) != 2 || rr.StoppedBy != "max-refunds" || rr.Remaining != 1 {
		t.Fatalf("max-refunds: %+v %v", rr, err)
	}
	rr, err = a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1000})
	if err != nil || len(rr.Refunded) != 0 || rr.StoppedBy != "max-cents" || rr.Remaining != 1 {
		t.Fatalf("max-cents: %+v %v", rr, err)
	}
	if n := len(b.refunds(t)); n != 2 {
		t.Fatalf("%d refunds at Stripe, want 2", n)
	}
}

// Invariant 6: a finding that names the ledger's charge is never refunded,
// whatever the finding says, and the table refuses charge = canonical.
func TestRefundRefusesTheLedgersCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.world(t)
	a := b.auditor(t, nil)
	ctx := context.Background()
	var id int64
	err := b.pool.QueryRow(ctx, `INSERT INTO audit_findings (kind, subject, customer_id, billing_period, charge_id,
		canonical_charge_id, amount_cents, currency) VALUES ('duplicate_charge', $1, 'dup', $2, $1, $3, 2500, 'usd')
		RETURNING id`, w.dupCanon, testPeriod, w.dup).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{FindingID: id})
	if err != nil || len(rr.Refunded) != 0 || len(rr.Skipped) != 1 || len(b.refunds(t)) != 0 {
		t.Fatalf("refund of the ledger's charge: %+v %v", rr, err)
	}
	_, err = b.pool.Exec(ctx, `INSERT INTO audit_findings (kind, subject, charge_id, canonical_charge_id)
		VALUES ('duplicate_charge', 'x', 'ch_x', 'ch_x')`)
	if err == nil || !strings.Contains(err.Error(), "never_refund_canonical") {
		t.Fatalf("charge = canonical accepted: %v", err)
	}
	if _, err := a.Refund(ctx, RefundOptions{FindingID: 999999}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown finding: %v", err)
	}
}

// Two runs at once: one skips (LockWait 0) or waits; never both at once.
func TestConcurrentRunsNeverOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	ctx := context.Background()
	locked, release := make(chan struct{}), make(chan struct{})
	first := b.auditor(t, nil)
	first.afterLock = func() { close(locked); <-release }
	var running atomic.Int32
	firstDone := make(chan error, 1)
	go func() {
		running.Add(1)
		_, err := first.Run(ctx, Window{})
		running.Add(-1)
		firstDone <- err
	}()
	<-locked

	skipper := b.auditor(t, nil)
	if _, err := skipper.Run(ctx, Window{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second run while the first holds the lock: %v, want ErrLocked", err)
	}
	waiter := b.auditor(t, func(c *Config) { c.LockWait = time.Minute })
	var sawFirstFinished atomic.Bool
	waiter.afterLock = func() {
		var status string
		_ = b.pool.QueryRow(ctx, `SELECT status FROM audit_runs ORDER BY id LIMIT 1`).Scan(&status)
		sawFirstFinished.Store(status == "ok")
	}
	waitDone := make(chan error, 1)
	go func() {
		_, err := waiter.Run(ctx, Window{})
		waitDone <- err
	}()
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if err := <-waitDone; err != nil {
		t.Fatal(err)
	}
	if !sawFirstFinished.Load() {
		t.Fatal("the waiting run got the lock before the first run finished")
	}
}

// The scheduled run's window starts at the checkpoint minus the overlap.
func TestCheckpointWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.auditor(t, nil)
	ctx := context.Background()
	rep, err := a.Run(ctx, Window{})
	if err != nil {
		t.Fatal(err)
	}
	to := now.Add(-DefaultSettleDelay)
	if !rep.To.Equal(to) || !rep.From.Equal(to.Add(-DefaultInitialLookback)) || rep.ExitCode() != 0 {
		t.Fatalf("first window [%s, %s)", rep.From, rep.To)
	}
	// A manual run does not move the checkpoint.
	if _, err := a.Run(ctx, Window{From: now.Add(-48 * time.Hour), To: now.Add(-47 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(2 * time.Hour)
	rep, err = a.Run(ctx, Window{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.From.Equal(to.Add(-DefaultOverlap)) || !rep.To.Equal(to.Add(2*time.Hour)) {
		t.Fatalf("second window [%s, %s)", rep.From, rep.To)
	}
	per, err := a.Run(ctx, Window{Period: testPeriod})
	if err != nil || !per.From.Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) || !per.To.Equal(now.Add(2*time.Hour-DefaultSettleDelay)) {
		t.Fatalf("period window [%s, %s) %v", per.From, per.To, err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	bad := []Config{
		{},
		{DB: setup(t).pool, Parallel: -1},
		{DB: setup(t).pool, LegacyPattern: "no group"},
		{DB: setup(t).pool, LegacyPattern: "(unclosed"},
		{DB: setup(t).pool, SettleDelay: -time.Second},
	}
	for i, c := range bad {
		if _, err := New(c); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
}

// --auto-refund: a scheduled run refunds the open duplicates within caps.
func TestAutoRefundWithinCaps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	a := b.auditor(t, func(c *Config) { c.AutoRefund, c.MaxRefunds, c.MaxCents = true, 2, 1_000_000 })
	rep, err := a.Run(context.Background(), Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Refund == nil || len(rep.Refund.Refunded) != 2 || rep.Refund.StoppedBy != "max-refunds" || len(b.refunds(t)) != 2 {
		t.Fatalf("auto-refund: %+v", rep.Refund)
	}
}

// A duplicate refunded by hand after the audit, wholly or in part, is no
// longer what the audit saw: it is skipped with the reason (recorded on the
// finding) and must not block the others, which are refunded.
func TestRefundSkipsDuplicatesChangedByHandAndGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.world(t)
	a := b.auditor(t, nil)
	ctx := context.Background()
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sim.RefundByHand(w.dup, 0); err != nil { // the whole duplicate, by hand
		t.Fatal(err)
	}
	if _, err := b.sim.RefundByHand(w.late, 100); err != nil { // part of another
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
	if err != nil {
		t.Fatalf("skipped refunds must not fail the run: %v", err)
	}
	if len(rr.Refunded) != 1 || rr.Refunded[0].ChargeID != w.partial || len(rr.Skipped) != 2 {
		t.Fatalf("refunded %+v skipped %+v", rr.Refunded, rr.Skipped)
	}
	for _, s := range rr.Skipped {
		if s.SkipCode != SkipDuplicateChanged {
			t.Errorf("%s skipped with %s (%s)", s.ChargeID, s.SkipCode, s.Skipped)
		}
	}
	if n := b.sim.Requests()["POST /v1/refunds"]; n != 1 {
		t.Fatalf("%d refund POSTs, want 1", n)
	}
	if ch, _ := b.sim.Charge(w.late); ch.AmountRefunded != 100 {
		t.Errorf("the partly hand-refunded duplicate was refunded further: %d", ch.AmountRefunded)
	}
	fs, _ := a.Store().Findings(ctx, Filter{Kind: KindDuplicate, State: StateOpen})
	if len(fs) != 2 {
		t.Fatalf("%d open duplicates, want 2", len(fs))
	}
	for _, f := range fs {
		if !strings.HasPrefix(f.RefundSkipReason, string(SkipDuplicateChanged)+": ") {
			t.Errorf("finding %d does not say why: %q", f.ID, f.RefundSkipReason)
		}
	}
}
