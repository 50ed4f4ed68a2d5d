package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// pair seeds one key charged twice: canonical (the ledger's) and duplicate.
func (b *bundle) pair(t testing.TB, cust string, amount int64) (canon, dup string) {
	t.Helper()
	canon = b.charge(cust, amount, w0.Add(2*time.Hour), 0)
	dup = b.charge(cust, amount, w0.Add(3*time.Hour), 0)
	b.seed(t, row(cust, amount, canon, w0.Add(2*time.Hour+time.Second)))
	return canon, dup
}

// refundLedger counts refund_ledger rows.
func (b *bundle) refundLedger(t testing.TB) int {
	t.Helper()
	var n int
	if err := b.ledger.DB().QueryRow(context.Background(), `SELECT count(*) FROM {schema}.refund_ledger`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) dupFinding(t testing.TB, a *Auditor, chargeID string) (Finding, bool) {
	t.Helper()
	fs, err := a.Store().Findings(context.Background(), Filter{Kind: KindDuplicate})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.ChargeID == chargeID {
			return f, true
		}
	}
	return Finding{}, false
}

// Issue 17: the canonical charge refunded by hand (wholly or partly) or
// disputed, before or after the audit found the duplicate: the duplicate is
// not refunded (the customer would have paid nothing), and the finding
// says why.
func TestRefundRefusedWhenTheCanonicalChangedAtStripe(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		before bool // the change happens before the audit run
		change func(b *bundle, canon string) error
		want   SkipCode
	}{
		{"refunded by hand after the audit", false, func(b *bundle, c string) error { _, err := b.sim.RefundByHand(c, 0); return err }, SkipCanonicalRefunded},
		{"partly refunded by hand after the audit", false, func(b *bundle, c string) error { _, err := b.sim.RefundByHand(c, 500); return err }, SkipCanonicalRefunded},
		{"disputed after the audit", false, func(b *bundle, c string) error { _, err := b.sim.Dispute(c); return err }, SkipCanonicalDisputed},
		{"refunded by hand before the audit", true, func(b *bundle, c string) error { _, err := b.sim.RefundByHand(c, 0); return err }, SkipCanonicalRefunded},
		{"partly refunded by hand before the audit", true, func(b *bundle, c string) error { _, err := b.sim.RefundByHand(c, 500); return err }, SkipCanonicalRefunded},
		{"disputed before the audit", true, func(b *bundle, c string) error { _, err := b.sim.Dispute(c); return err }, SkipCanonicalDisputed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			canon, dup := b.pair(t, "c1", 2500)
			a := b.auditor(t, nil)
			ctx := context.Background()
			if tc.before {
				if err := tc.change(b, canon); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
				t.Fatal(err)
			}
			if !tc.before {
				if err := tc.change(b, canon); err != nil {
					t.Fatal(err)
				}
			}
			byHand := b.sim.Requests()["POST /v1/refunds"]
			rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
			if err != nil {
				t.Fatal(err)
			}
			if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 0 {
				t.Fatalf("the duplicate was refunded (%d) although its canonical changed", ch.AmountRefunded)
			}
			if n := b.sim.Requests()["POST /v1/refunds"] - byHand; n != 0 || len(rr.Refunded) != 0 || b.refundLedger(t) != 0 {
				t.Fatalf("%d refund POSTs, report %+v, %d refund_ledger rows", n, rr, b.refundLedger(t))
			}
			f, ok := b.dupFinding(t, a, dup)
			if !ok {
				if tc.before {
					return // the audit saw the customer paid at most once: nothing to refund
				}
				t.Fatal("no duplicate finding")
			}
			if f.State != StateOpen || !strings.HasPrefix(f.RefundSkipReason, string(tc.want)+": ") {
				t.Fatalf("finding %s %q, want open with %s", f.State, f.RefundSkipReason, tc.want)
			}
			if len(rr.Skipped) != 1 || rr.Skipped[0].SkipCode != tc.want {
				t.Fatalf("skipped %+v", rr.Skipped)
			}
		})
	}
}

// Issue 17: one refund must not block the rest. The first refund POST fails
// transiently (an injected 500), one duplicate is over the run's cents cap:
// both are skipped with their reason, the others are refunded, Slack is told
// what was skipped, and the next run refunds the transient one.
func TestRefundRunSkipsATransientFailureAndACappedDuplicateAndGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dups := map[string]string{}
	for _, c := range []string{"a", "b", "c"} {
		_, dups[c] = b.pair(t, c, 2500)
	}
	_, big := b.pair(t, "big", 9000)
	a := b.auditor(t, nil)
	ctx := context.Background()
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	if err := b.sim.SetFaults(stripesim.Faults{FailNextRefunds: 1}); err != nil {
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 8000})
	if err != nil {
		t.Fatalf("a transient failure must not fail the run: %v", err)
	}
	codes := map[SkipCode]int{}
	for _, s := range rr.Skipped {
		codes[s.SkipCode]++
		if s.SkipCode == SkipMaxCents && s.ChargeID != big {
			t.Errorf("%s skipped by the cents cap", s.ChargeID)
		}
	}
	if len(rr.Refunded) != 2 || codes[SkipTransient] != 1 || codes[SkipMaxCents] != 1 || rr.StoppedBy != "max-cents" || rr.Remaining != 1 {
		t.Fatalf("refunded %d, skipped %v, stopped by %q (%d)", len(rr.Refunded), codes, rr.StoppedBy, rr.Remaining)
	}
	if n, want := len(b.refunds(t)), 2; n != want || b.refundLedger(t) != want || b.sim.Requests()["POST /v1/refunds"] != 3 {
		t.Fatalf("%d refunds at Stripe, %d in refund_ledger, %d POSTs; want 2, 2, 3", n, b.refundLedger(t), b.sim.Requests()["POST /v1/refunds"])
	}
	var alert *alerts.Alert
	for _, al := range b.mem.Alerts() {
		if al.Kind == alerts.KindRefundSkipped {
			alert = &al
		}
	}
	if alert == nil || !strings.Contains(alertText(*alert), "transient") || !strings.Contains(alertText(*alert), "max_cents") {
		t.Fatalf("no refund_skipped alert naming both reasons: %+v", alert)
	}

	rr, err = a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 8000})
	if err != nil || len(rr.Refunded) != 1 || rr.Refunded[0].ChargeID == big {
		t.Fatalf("the next run: %+v %v", rr, err)
	}
	for c, id := range dups {
		if ch, _ := b.sim.Charge(id); !ch.Refunded {
			t.Errorf("duplicate of %s not refunded", c)
		}
	}
}

func alertText(a alerts.Alert) string {
	var sb strings.Builder
	sb.WriteString(a.Title + "\n" + a.Text + "\n")
	for _, f := range a.Fields {
		sb.WriteString(f.Label + ": " + f.Value + "\n")
	}
	for _, it := range a.Items {
		sb.WriteString(it.Text + "\n")
	}
	return sb.String()
}

// Issue 17: the rolling cap is persisted and shared. An `auditor refund`
// and a later --auto-refund run (another Auditor, as another process
// would be) together cannot pass --max-refunds-24h or --max-cents-24h;
// 24 hours later the cap has room again.
func TestRollingRefundCapHoldsAcrossRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want SkipCode
	}{
		{"count", func(c *Config) { c.MaxRefunds24h = 2 }, SkipMaxRefunds24h},
		{"cents", func(c *Config) { c.MaxCents24h = 6000 }, SkipMaxCents24h},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, c := range []string{"a", "b", "c"} {
				b.pair(t, c, 2500)
			}
			ctx := context.Background()
			a := b.auditor(t, tc.mod)
			if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
				t.Fatal(err)
			}
			rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 1, MaxCents: 1_000_000})
			if err != nil || len(rr.Refunded) != 1 {
				t.Fatalf("first run: %+v %v", rr, err)
			}
			auto := b.auditor(t, func(c *Config) { tc.mod(c); c.AutoRefund, c.MaxRefunds, c.MaxCents = true, 100, 1_000_000 })
			rep, err := auto.Run(ctx, Window{From: w0, To: w1})
			if err != nil || rep.Refund == nil {
				t.Fatalf("auto-refund run: %v", err)
			}
			if len(rep.Refund.Refunded) != 1 || len(rep.Refund.Skipped) != 1 || rep.Refund.Skipped[0].SkipCode != tc.want {
				t.Fatalf("auto-refund: refunded %d, skipped %+v", len(rep.Refund.Refunded), rep.Refund.Skipped)
			}
			if n := len(b.refunds(t)); n != 2 || b.refundLedger(t) != 2 || rep.Refund.Rolling.Refunds != 2 {
				t.Fatalf("%d refunds at Stripe, %d in refund_ledger, rolling %+v; want 2", n, b.refundLedger(t), rep.Refund.Rolling)
			}
			dry, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000, DryRun: true})
			if err != nil || len(dry.Refunded) != 0 || len(dry.Skipped) != 1 {
				t.Fatalf("dry run within the window: %+v %v", dry, err)
			}
			b.clk.Advance(24*time.Hour + time.Second)
			rr, err = a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
			if err != nil || len(rr.Refunded) != 1 || len(b.refunds(t)) != 3 {
				t.Fatalf("a day later: %+v %v", rr, err)
			}
		})
	}
}

// waitForKeyWaiter returns once someone waits for k's ledger lock (a
// condition, polled; never a sleep that hopes the other side got there).
func waitForKeyWaiter(t *testing.T, l *ledger.Ledger, k ledger.Key) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := l.KeyLockWaiters(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody waits for the lock of %s", k)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Issue 17, a refund racing a ledger recording of a different charge for
// the key, both orders. The canonical is never refunded:
//   - the ledger write holds the key first (it records the finding's
//     duplicate as the key's charge): the refund waits, re-reads the
//     ledger, and refuses;
//   - the refund holds the key first (the hook, right before the POST): an
//     import recording the duplicate for the key (a restored ledger) waits,
//     then refuses to make a refunded charge the key's charge.
func TestRefundRacingALedgerRecordingNeverRefundsTheCanonical(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := ledger.Key{CustomerID: "race", BillingPeriod: testPeriod}

	t.Run("ledger first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, dup := b.pair(t, "race", 2500)
		a := b.auditor(t, nil)
		if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
			t.Fatal(err)
		}
		tx, err := b.ledger.Begin(ctx) // a ledger write in progress
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := b.ledger.LockKey(ctx, tx, k); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE {schema}.billing_records SET charge_id = $1
			WHERE customer_id = $2 AND billing_period = $3`, dup, k.CustomerID, k.BillingPeriod); err != nil {
			t.Fatal(err)
		}
		type result struct {
			rr  RefundReport
			err error
		}
		done := make(chan result, 1)
		go func() {
			rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
			done <- result{rr, err}
		}()
		waitForKeyWaiter(t, b.ledger, k)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil || len(res.rr.Refunded) != 0 || len(res.rr.Skipped) != 1 || res.rr.Skipped[0].SkipCode != SkipLedgerRecordsCharge {
			t.Fatalf("refund: %+v %v", res.rr, res.err)
		}
		if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 0 || len(b.refunds(t)) != 0 {
			t.Fatal("the ledger's charge was refunded")
		}
	})

	t.Run("refund first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		canon, dup := b.pair(t, "race", 2500)
		imported := make(chan error, 1)
		a := b.auditor(t, func(c *Config) {
			c.Test.BeforeRefund = func(f Finding) {
				go func() {
					_, err := b.ledger.Import(ctx, []ledger.Record{{Key: k, StripeCustomerID: "cus_race", AmountCents: 2500,
						Currency: "usd", IdempotencyKey: key("race"), Status: ledger.StatusCharged, ChargeID: f.ChargeID,
						ChargedAt: now, FirstAttemptAt: now}})
					imported <- err
				}()
				waitForKeyWaiter(t, b.ledger, k)
			}
		})
		if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
			t.Fatal(err)
		}
		// The ledger row is lost (a restored backup) after the audit.
		if _, err := b.ledger.DB().Exec(ctx, `DELETE FROM {schema}.billing_records WHERE customer_id = $1`, k.CustomerID); err != nil {
			t.Fatal(err)
		}
		rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
		if err != nil || len(rr.Refunded) != 1 || rr.Refunded[0].ChargeID != dup {
			t.Fatalf("refund: %+v %v", rr, err)
		}
		if err := <-imported; !errors.Is(err, ledger.ErrChargeRefunded) {
			t.Fatalf("importing the refunded duplicate as the key's charge: %v, want ErrChargeRefunded", err)
		}
		if _, err := b.ledger.Get(ctx, k); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("the ledger recorded a charge for the key: %v", err)
		}
		if ch, _ := b.sim.Charge(canon); ch.AmountRefunded != 0 {
			t.Fatal("the canonical was refunded")
		}
	})
}

// Issue 26: a failover to an asynchronous replica (or a restore) erased
// refund_ledger rows of refunds Stripe made: the rolling cap must count
// them anyway. The next refund run reads the last day of pelguard's
// refunds at Stripe first, records the missing ones again, and stops at
// the cap.
func TestRollingRefundCapCountsRefundsTheLedgerLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []string{"a", "b", "c"} {
		b.pair(t, c, 2500)
	}
	ctx := context.Background()
	capped := func(c *Config) { c.MaxRefunds24h = 2 }
	a := b.auditor(t, capped)
	if _, err := a.Run(ctx, Window{From: w0, To: w1}); err != nil {
		t.Fatal(err)
	}
	rr, err := a.Refund(ctx, RefundOptions{MaxRefunds: 2, MaxCents: 1_000_000})
	if err != nil || len(rr.Refunded) != 2 {
		t.Fatalf("first run: %+v %v", rr, err)
	}
	// The rollback: the two refunds are gone from the ledger, not from Stripe.
	if _, err := b.pool.Exec(ctx, `DELETE FROM refund_ledger`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE audit_findings SET state = 'open', refund_id = NULL, refunded_cents = NULL, refunded_at = NULL WHERE state = 'refunded'`); err != nil {
		t.Fatal(err)
	}
	rr, err = b.auditor(t, capped).Refund(ctx, RefundOptions{MaxRefunds: 100, MaxCents: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.refunds(t)); n != 2 || len(rr.Refunded) != 0 || b.refundLedger(t) != 2 {
		t.Fatalf("after the ledger lost its refunds: %d refunds at Stripe (want still 2), refunded %d this run, %d in refund_ledger (want 2 rebuilt)",
			n, len(rr.Refunded), b.refundLedger(t))
	}
	for _, s := range rr.Skipped {
		if s.SkipCode != SkipMaxRefunds24h && s.SkipCode != SkipDuplicateChanged {
			t.Fatalf("skipped %+v: want the rolling cap (or the refund already made)", s)
		}
	}
}
