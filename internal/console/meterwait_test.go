package console

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
)

// waitMeterHandled waits (up to 180 s: one customer-meter's events go one
// per turn of the consumer's own pending entries, and a full make test
// under -race slows those turns) until the meter consumer name reports at
// least n events handled and the group has none pending. "Handled" counts
// every outcome, so an entry the consumer met twice (its customer's slot
// busy on a loaded machine, the entry read again) counts twice and the
// count may pass n: meterHandled reads it. It fails at once with the consumer's own error if its Run
// returned (putting the error back for the test's cleanup), and on a
// timeout it says where the events are: pending in the group, and the
// ledger's rows by status.
func (b *bundle) waitMeterHandled(t *testing.T, stream, group, name string, done chan error, n int64) {
	t.Helper()
	ctx := context.Background()
	rdb := b.rdb
	deadline := time.Now().Add(180 * time.Second)
	for {
		st, err := consumer.ReadStats(ctx, rdb, stream, group, []string{name})
		if err == nil && st[name].Events >= n {
			if p, err := rdb.XPending(ctx, stream, group).Result(); err == nil && p.Count == 0 {
				return
			}
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the meter consumer %s stopped before handling %d events: %v", name, n, err)
		default:
		}
		if time.Now().After(deadline) {
			var pending int64
			if p, err := rdb.XPending(ctx, stream, group).Result(); err == nil {
				pending = p.Count
			}
			var rows string
			_ = b.cfg.DB.QueryRow(ctx, `SELECT coalesce(string_agg(status || '=' || c, ', '), 'none') FROM
				(SELECT status, count(*) AS c FROM `+b.cfg.Schema+`.meter_events GROUP BY 1) s`).Scan(&rows)
			t.Fatalf("timed out after 180s: the meter consumer %s handled %d of %d events (stats error %v); %d entries pending; ledger rows: %s",
				name, st[name].Events, n, err, pending, rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// meterHandled is the events handled that the meter consumer name has
// published (its Stats).
func (b *bundle) meterHandled(t *testing.T, stream, group, name string) int64 {
	t.Helper()
	st, err := consumer.ReadStats(context.Background(), b.rdb, stream, group, []string{name})
	if err != nil {
		t.Fatal(err)
	}
	return st[name].Events
}

// between reports whether the panel's figure s is a number in [lo, hi].
func between(s string, lo, hi int64) bool {
	v, err := strconv.ParseInt(s, 10, 64)
	return err == nil && v >= lo && v <= hi
}
