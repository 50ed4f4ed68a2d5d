package meterledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

func restored(r meterledger.Request, st meterledger.Status) meterledger.Restored {
	ev := r.Event
	out := meterledger.Restored{Key: meterledger.KeyOf(ev, r.Identifier), EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID,
		CustomerID: ev.CustomerID, Value: ev.Value, Status: st, FirstSentAt: t0, MessageID: "9-0"}
	if st == meterledger.StatusParked {
		out.Reason = "parked by the test"
	}
	return out
}

// TestRestoreAfterARollback: what a ledger repair writes back. A missing
// row is inserted with its witnessed status and counted in meter_usage
// once, however often the repair runs; a row the rollback took back to
// sending gets the witnessed outcome under a new epoch (its holder can no
// longer finish it) without being counted again; a parked row witnessed
// delivered becomes delivered; a row that records another event, or that
// Stripe refused, is left and reported.
func TestRestoreAfterARollback(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	at := t0.Add(-time.Hour)
	lost := req(mev("cus_R", "api", 4, at), "a")
	sending := req(mev("cus_R", "api", 6, at.Add(time.Second)), "a")
	parked := req(mev("cus_R", "api", 1, at.Add(2*time.Second)), "a")
	pc := b.one(t, parked)
	if rec, err := b.l.Finish(ctx, []meterledger.Outcome{{Hold: pc.Hold(), Result: meterledger.Park, Reason: "unknown"}}); err != nil || !rec[0] {
		t.Fatalf("parking: %v %v", err, rec)
	}
	sc := b.one(t, sending) // its holder is in flight when the rollback happens
	if !sc.Decision.MaySend() {
		t.Fatalf("reserving: %+v", sc)
	}
	units := func() int64 {
		us, err := b.l.Usage(ctx, "api", "cus_R", at)
		if err != nil || len(us) != 1 {
			t.Fatalf("usage: %v %+v", err, us)
		}
		return us[0].Units
	}
	if u := units(); u != 7 {
		t.Fatalf("meter_usage before the restore: %d, want 7 (sending 6 + parked 1)", u)
	}
	evs := []meterledger.Restored{restored(lost, meterledger.StatusDelivered), restored(sending, meterledger.StatusDelivered),
		restored(parked, meterledger.StatusDelivered)}
	res, err := b.l.Restore(ctx, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []meterledger.RestoreOutcome{meterledger.RestoreInserted, meterledger.RestoreRepaired, meterledger.RestoreRepaired}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("event %d: %s (%s), want %s", i, r.Outcome, r.Detail, want[i])
		}
		rec, err := b.l.Get(ctx, evs[i].Key)
		if err != nil || rec.Status != meterledger.StatusDelivered || rec.LeaseOwner != "" {
			t.Errorf("event %d after the restore: %+v, %v", i, rec, err)
		}
	}
	if u := units(); u != 11 {
		t.Fatalf("meter_usage after the restore: %d, want 11 (the lost event's 4 added once)", u)
	}
	// The holder from before the rollback cannot finish the row.
	if rec, err := b.l.Finish(ctx, []meterledger.Outcome{{Hold: sc.Hold(), Result: meterledger.Failed, Reason: "late"}}); err != nil || rec[0] {
		t.Fatalf("a holder from before the restore finished the row: %v %v", err, rec)
	}
	// Idempotent: nothing changes, nothing is counted twice.
	res, err = b.l.Restore(ctx, evs, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != meterledger.RestoreUnchanged {
			t.Errorf("second restore, event %d: %s", i, r.Outcome)
		}
	}
	if u := units(); u != 11 {
		t.Fatalf("meter_usage after a second restore: %d, want 11", u)
	}
	// Another event under the same identifier: left as it is, reported.
	other := restored(lost, meterledger.StatusDelivered)
	other.Value = 40
	res, err = b.l.Restore(ctx, []meterledger.Restored{other}, true)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != meterledger.RestoreConflict || res[0].Detail == "" {
		t.Fatalf("a conflicting witness: %+v", res[0])
	}
	// A park by the repair (repairRows false) never touches an existing row.
	res, err = b.l.Restore(ctx, []meterledger.Restored{restored(lost, meterledger.StatusParked)}, false)
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := b.l.Get(ctx, evs[0].Key); res[0].Outcome != meterledger.RestoreUnchanged || rec.Status != meterledger.StatusDelivered {
		t.Fatalf("parking over a delivered row: %+v, row %s", res[0], rec.Status)
	}
}
