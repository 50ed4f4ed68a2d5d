package consumercli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestMeterSettleCommand: a parked event settled as not counted is
// recorded failed with who and why, its units leave the customer's use;
// settling it again, or settling an event still sending, is refused with
// exit 2.
func TestMeterSettleCommand(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	ctx := context.Background()
	l, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePartitions(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	ts := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	reserve := func(id string, res meterledger.Result) meterledger.Key {
		ev := event.MeterEvent{EventName: "api", StripeCustomerID: "cus_1", Value: 6, Timestamp: ts, EventID: id}
		cl, err := l.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: id, Owner: "t", Lease: time.Minute}})
		if err != nil || !cl[0].Decision.MaySend() {
			t.Fatalf("reserve %s: %v %+v", id, err, cl)
		}
		if res != 0 {
			if _, err := l.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: res, Reason: "lost"}}); err != nil {
				t.Fatal(err)
			}
		}
		return meterledger.KeyOf(ev, id)
	}
	parked := reserve("pg_parked", meterledger.Park)
	reserve("pg_other", meterledger.Release)
	args := func(id, verdict string) []string {
		return []string{"meter-settle", "--database-url", url, "--db-schema", schema, "--identifier", id,
			"--event-ts", ts.Format(time.RFC3339Nano), verdict, "--reason", "not in the meter's events at Stripe"}
	}
	if code, out, errs := call(ctx, args("pg_parked", "--not-counted")...); code != 0 || !strings.Contains(out, "not counted") {
		t.Fatalf("settle: exit %d %s %s", code, out, errs)
	}
	rec, err := l.Get(ctx, parked)
	if err != nil || rec.Status != meterledger.StatusFailed || !strings.Contains(rec.LastError, "settled as not counted at Stripe by ") ||
		!strings.Contains(rec.LastError, "not in the meter's events") {
		t.Fatalf("row after settling %+v %v", rec, err)
	}
	if us, err := l.Usage(ctx, "api", "cus_1", ts); err != nil || len(us) != 1 || us[0].Units != 6 {
		t.Fatalf("use %+v %v: want only the sending event's 6 units", us, err)
	}
	if code, _, errs := call(ctx, args("pg_parked", "--counted")...); code != 2 || !strings.Contains(errs, "failed") {
		t.Fatalf("settling twice: exit %d %s", code, errs)
	}
	if code, _, errs := call(ctx, args("pg_other", "--counted")...); code != 2 || !strings.Contains(errs, "sending") {
		t.Fatalf("settling a sending event: exit %d %s", code, errs)
	}
}
