package audit

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
)

// Each run records, per meter and customer it compared, its span and the
// windows it held back (delivery not settled): a held window is recorded
// as held, then as compared once it settled; a customer-meter no run
// touched has no row.
func TestUsageComparedIsRecorded(t *testing.T) {
	t.Parallel()
	w := setupUsage(t, stripesim.FormulaSum, stripesim.Faults{})
	hour := now.Add(-2 * time.Hour) // [10:00, 11:00), delivered at 12:00
	w.deliver("cus_A", 5, hour.Add(10*time.Minute))
	a := w.auditor(nil)
	ctx := context.Background()
	type row struct {
		run          int64
		windows      int64
		held         int32
		heldFrom     *time.Time
		from, to, at time.Time
	}
	read := func(cust string) (row, bool) {
		var r row
		err := w.db().QueryRow(ctx, `SELECT run_id, windows, held_windows, held_from, compared_from, compared_to, compared_at
			FROM {schema}.usage_compared WHERE event_name = $1 AND stripe_customer_id = $2`, w.meter, cust).
			Scan(&r.run, &r.windows, &r.held, &r.heldFrom, &r.from, &r.to, &r.at)
		return r, err == nil
	}
	// 12:01: delivered a minute ago: the hour is held back.
	w.tick(time.Minute)
	rep := w.run(a)
	r, ok := read("cus_A")
	if !ok || r.run != rep.RunID || r.windows != 0 || r.held != 1 || r.heldFrom == nil || !r.heldFrom.Equal(hour) {
		t.Fatalf("first run: %+v %v, want held 1 from %s; report %+v", r, ok, hour, rep)
	}
	// 12:15: settled: compared, nothing held.
	w.tick(14 * time.Minute)
	rep = w.run(a)
	r, ok = read("cus_A")
	if !ok || r.run != rep.RunID || r.windows != 1 || r.held != 0 || r.heldFrom != nil || !r.to.Equal(rep.To) || !r.from.Equal(rep.DailyFrom) {
		t.Fatalf("second run: %+v %v (report %+v)", r, ok, rep)
	}
	if _, ok := read("cus_nobody"); ok {
		t.Fatal("a customer no run compared has a row")
	}
	// A row no run rewrote for 40 days is forgotten by the next run.
	if _, err := w.db().Exec(ctx, `INSERT INTO {schema}.usage_compared (event_name, stripe_customer_id, run_id, compared_at, compared_from, compared_to)
		VALUES ($1, 'cus_gone', 1, $2, $2, $3)`, w.meter, now.Add(-41*24*time.Hour), now.Add(-40*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	w.run(a)
	if _, ok := read("cus_gone"); ok {
		t.Fatal("a customer-meter not compared for 41 days is kept")
	}
}
