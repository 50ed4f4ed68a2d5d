package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
)

func (b *bundle) stagedRows(t testing.TB) (n int) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.cfg.Schema+`.audit_stage`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The stage belongs to one run: a run leaves nothing behind, whether it
// succeeds or fails, and the rows a crashed run left are cleared by the
// next run (which holds the run lock, so no live run owns them) without
// mixing into its findings.
func TestStageIsPerRunAndCleared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := w0.Add(2 * time.Hour)
	id := b.charge("alice", 2500, at, 0)
	dup := b.charge("alice", 2500, at.Add(time.Minute), 0)
	b.seed(t, row("alice", 2500, id, at.Add(time.Second)))
	// A crashed run's stage: a duplicate of alice that does not exist at
	// Stripe. Mixed in, it would be a finding.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.cfg.Schema+`.audit_stage (run_id, grp, charge_id, customer_id,
		billing_period, created, amount_cents, currency) VALUES (424242, 1, 'ch_ghost', 'alice', $1, $2, 2500, 'usd')`,
		testPeriod, at.Unix()); err != nil {
		t.Fatal(err)
	}
	a := b.auditor(t, nil)
	rep, err := a.Run(ctx, Window{From: w0, To: w1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != KindDuplicate || rep.Findings[0].ChargeID != dup {
		t.Fatalf("findings %+v, want only %s a duplicate", rep.Findings, dup)
	}
	if n := b.stagedRows(t); n != 0 {
		t.Fatalf("%d staged rows after the run, want 0", n)
	}

	// A failed run (Stripe answers 500 to the listing) clears its stage too.
	if err := b.sim.SetFaults(stripesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err == nil {
		t.Fatal("a run against a failing Stripe succeeded")
	}
	if n := b.stagedRows(t); n != 0 {
		t.Fatalf("%d staged rows after a failed run, want 0", n)
	}
}
