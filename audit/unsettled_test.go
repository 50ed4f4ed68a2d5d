package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/ledger"
)

// alertsNaming counts the audit summaries sent that name id.
func (b *bundle) alertsNaming(id string) int {
	n := 0
	for _, al := range b.mem.Alerts() {
		if al.Kind != alerts.KindAuditSummary {
			continue
		}
		text := al.Text
		for _, it := range al.Items {
			text += it.Text
		}
		if strings.Contains(text, id) {
			n++
		}
	}
	return n
}

// An unsettled processing row (issue 25): the bank failed gina's debit at
// Stripe, and nobody settles her row (the consumer's follow-up loop is off,
// or its polls fail). The auditor, which followed the debit while it was
// pending, neither forgets it nor stays silent: once the debit has been
// final longer than a working loop takes to settle it, a stuck_pending
// finding says the customer is unbilled, and the run alerts. Settling the
// row resolves it and the debit is forgotten.
func TestFailedDebitOfAnUnsettledProcessingRowIsReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := w0.Add(2 * time.Hour)
	id := b.debit("gina", at, nil)
	b.seed(t, processing("gina", id, at.Add(time.Second)))
	a := b.auditor(t, nil)
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil || len(rep.Findings) != 0 || rep.PendingCharges != 1 {
		t.Fatalf("pending: %v, findings %+v, %d followed; want none, 1", err, rep.Findings, rep.PendingCharges)
	}
	if err := b.sim.Settle(id, false, "insufficient_funds"); err != nil {
		t.Fatal(err)
	}

	// An hour later: a working loop may not have polled yet. No finding,
	// and the debit is still followed.
	b.clk.Advance(time.Hour)
	from := w1
	rep, err = a.Run(ctx, Window{From: from, To: b.clk.Now().Add(-10 * time.Minute)})
	if err != nil || len(rep.Findings) != 0 || rep.PendingRechecked != 1 || rep.PendingCharges != 1 {
		t.Fatalf("1 h after: %v, findings %+v, %d rechecked, %d followed; want none, 1, 1", err, rep.Findings, rep.PendingRechecked, rep.PendingCharges)
	}

	// A day later nothing has settled it.
	b.clk.Advance(24 * time.Hour)
	from = rep.To
	rep, err = a.Run(ctx, Window{From: from, To: b.clk.Now().Add(-10 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	k := byKind(rep.Findings)
	if len(rep.Findings) != 1 || len(k[KindStuckPending]) != 1 || k[KindStuckPending][0].ChargeID != id ||
		!strings.Contains(k[KindStuckPending][0].Detail, "failed") || rep.ExitCode() != 1 {
		t.Fatalf("a day after: findings %+v (exit %d); want one stuck_pending naming %s failed", rep.Findings, rep.ExitCode(), id)
	}
	if n := b.alertsNaming(id); n != 1 {
		t.Fatalf("%d audit summaries name %s, want 1: %+v", n, id, b.mem.Alerts())
	}

	// The row is settled (declined): the next run resolves the finding
	// and forgets the debit.
	if _, err := b.ledger.Settle(ctx, ledger.Key{CustomerID: "gina", BillingPeriod: testPeriod},
		ledger.Settlement{ChargeID: id, FailureCode: "insufficient_funds", Error: "insufficient funds"}); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(time.Hour)
	from = rep.To
	rep, err = a.Run(ctx, Window{From: from, To: b.clk.Now().Add(-10 * time.Minute)})
	if err != nil || len(rep.Resolved) != 1 || rep.Resolved[0].ChargeID != id || rep.PendingCharges != 0 {
		t.Fatalf("settled: %v, resolved %+v, %d followed; want the finding resolved, nothing followed", err, rep.Resolved, rep.PendingCharges)
	}
}

// A processing row whose debit the auditor never followed (its window was
// audited before pelguard remembered pending charges, or audit_pending was
// lost) is stuck once it has waited longer than --stuck-processing-after
// (default three weeks, past the slowest bank debit); not before.
func TestProcessingRowOlderThanTheBoundIsStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := now.Add(-22 * 24 * time.Hour)
	id := b.debit("hank", old, nil)
	r := processing("hank", id, old.Add(time.Second))
	r.UpdatedAt = old.Add(time.Second)
	young := processing("ivy", b.debit("ivy", now.Add(-20*24*time.Hour), nil), now.Add(-20*24*time.Hour))
	b.seed(t, r, young)
	rep, err := b.auditor(t, nil).Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	k := byKind(rep.Findings)
	if len(rep.Findings) != 1 || len(k[KindStuckPending]) != 1 || k[KindStuckPending][0].ChargeID != id || b.alertsNaming(id) != 1 {
		t.Fatalf("findings %+v; want only hank's processing row stuck (and alerted)", rep.Findings)
	}
	// The bound is configurable.
	rep, err = b.auditor(t, func(c *Config) { c.StuckProcessingAfter = 30 * 24 * time.Hour }).Run(ctx, Window{From: w0, To: w1})
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("--stuck-processing-after 720h: %v, findings %+v", err, rep.Findings)
	}
}

// Issue 25 item 3: a row the ledger parked (its own retries gave up) is a
// stuck_pending finding at once, saying why and what to run — not only
// after --stuck-after, and never silently refreshed away.
func TestParkedRowIsStuckAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	parked, fresh := row("jo", 2500, "", now.Add(-time.Minute)), row("kim", 2500, "", now.Add(-time.Minute))
	parked.UpdatedAt, fresh.UpdatedAt = now.Add(-time.Minute), now.Add(-time.Minute)
	b.seed(t, parked, fresh)
	if _, err := b.ledger.DB().Exec(ctx, `UPDATE {schema}.billing_records SET parked_at = $1, attempt = 2,
		parked_reason = 'closing attempt 1''s payment intent pi_1: 403' WHERE customer_id = 'jo'`, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	rep, err := b.auditor(t, nil).Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	k := byKind(rep.Findings)
	if len(rep.Findings) != 1 || len(k[KindStuckPending]) != 1 || k[KindStuckPending][0].CustomerID != "jo" ||
		!strings.Contains(k[KindStuckPending][0].Detail, "pi_1: 403") || !strings.Contains(k[KindStuckPending][0].Detail, "consumer retry") {
		t.Fatalf("findings %+v; want jo's parked row stuck, kim's (a minute old, not parked) not", rep.Findings)
	}
}
