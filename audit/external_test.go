package audit

import (
	"context"
	"testing"

	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A team that keeps its own consumer (reaper --external-ledger): its table
// names the later of two charges of one customer and period (the monitor's
// re-charge recorded, the first charge lost before its INSERT). With
// --legacy --external-ledger the earlier one is the duplicate and the only
// one refunded; the charge the team's table names is never refunded. The
// control without --external-ledger takes the earliest as canonical and
// would refund the team's.
func TestExternalLedgerTheTeamsChargeIsNeverRefunded(t *testing.T) {
	t.Parallel()
	for _, external := range []bool{true, false} {
		b := setup(t)
		ctx := context.Background()
		team := "team_" + testenv.Suffix()
		t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+team+" CASCADE") })
		if err := teamsys.CreateTable(ctx, b.pool, team); err != nil {
			t.Fatal(err)
		}
		first := b.legacyCharge("ex", at1)
		recorded := b.legacyCharge("ex", at2)
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+team+`.billing_records (customer_id, billing_period, charge_id, amount_cents, status)
			VALUES ('ex', $1, $2, 2500, 'charged')`, testPeriod, recorded); err != nil {
			t.Fatal(err)
		}
		before := testenv.Snapshot(t, b.pool, team)
		a := b.auditor(t, func(c *Config) {
			legacyMode(c)
			if external {
				c.ExternalLedger = team + ".billing_records"
			}
		})
		rep, err := a.Run(ctx, Window{From: w0, To: w1})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Findings) != 1 || rep.Findings[0].Kind != KindDuplicate {
			t.Fatalf("external=%v: findings %+v, want one duplicate", external, rep.Findings)
		}
		f := rep.Findings[0]
		want, canon := first, recorded
		if !external {
			want, canon = recorded, first // the control: earliest is canonical
		}
		if f.ChargeID != want || f.CanonicalChargeID != canon {
			t.Fatalf("external=%v: duplicate %s of %s, want %s of %s", external, f.ChargeID, f.CanonicalChargeID, want, canon)
		}
		if !external {
			continue
		}
		if got := b.refundAll(t, a); len(got) != 1 || got[0] != first {
			t.Fatalf("refunded %v, want only %s", got, first)
		}
		if ch, _ := b.sim.Charge(recorded); ch.AmountRefunded != 0 {
			t.Fatalf("the charge the team's table names was refunded: %+v", ch)
		}
		if got := testenv.Snapshot(t, b.pool, team); got != before {
			t.Fatalf("the audit changed the team's table:\n%s\n%s", before, got)
		}
	}
}
