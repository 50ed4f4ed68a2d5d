package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/ledger"
)

// waitForWaiters returns once n transactions wait for k's lock: a condition,
// polled, never a sleep that hopes the other side got there.
func waitForWaiters(t *testing.T, l *ledger.Ledger, k ledger.Key, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := l.KeyLockWaiters(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters for the lock of %s after 10 s, want %d", got, k, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A refund racing a ledger recording: the refund holds the key's lock from
// its last look to its recorded refund. Finish and FinishCharged wait for
// it, then refuse to record the charge it refunded; Import likewise.
func TestChargeRecordingWaitsForARefundOfTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, how := range []string{"Finish", "FinishCharged", "Import"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			e := ev("race-"+how, 2500)
			k := ledger.EventKey(e)
			var rec ledger.Record
			if how != "Import" {
				c, err := b.l.Reserve(ctx, req(e, "A"))
				if err != nil {
					t.Fatal(err)
				}
				rec = c.Record
			}
			tx, err := b.l.Begin(ctx) // the refund
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := b.l.LockKey(ctx, tx, k); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				switch how {
				case "Finish":
					_, err := b.l.Finish(ctx, rec, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_dup"})
					done <- err
				case "FinishCharged":
					got, err := b.l.FinishCharged(ctx, []ledger.Charged{{Record: rec, ChargeID: "ch_dup"}})
					if err == nil && got[k] {
						err = errors.New("recorded")
					} else if err == nil {
						err = ledger.ErrChargeRefunded
					}
					done <- err
				case "Import":
					_, err := b.l.Import(ctx, []ledger.Record{{Key: k, StripeCustomerID: e.StripeCustomerID, AmountCents: 2500,
						Currency: "usd", IdempotencyKey: e.Key("test"), Status: ledger.StatusCharged, ChargeID: "ch_dup",
						ChargedAt: b.clk.Now(), FirstAttemptAt: b.clk.Now()}})
					done <- err
				}
			}()
			waitForWaiters(t, b.l, k, 1)
			select {
			case err := <-done:
				t.Fatalf("the ledger write did not wait for the refund's lock: %v", err)
			default:
			}
			if _, err := tx.Exec(ctx, `INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents,
				currency, source) VALUES (now(), 'ch_dup', 're_1', 2500, 'usd', 'test')`); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, ledger.ErrChargeRefunded) {
				t.Fatalf("recording the refunded charge: %v, want ErrChargeRefunded", err)
			}
			if got, err := b.l.Get(ctx, k); err == nil && got.ChargeID == "ch_dup" {
				t.Fatalf("the ledger records the refunded charge: %+v", got)
			}
		})
	}
}
