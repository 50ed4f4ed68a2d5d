package console

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
)

// waitMeterHandled waits until the meter consumer name reports n events
// handled. It fails at once with the consumer's own error if its Run
// returned (putting the error back for the test's cleanup), and on a
// timeout it says where the events are: pending in the group, and the
// ledger's rows by status.
func (b *bundle) waitMeterHandled(t *testing.T, stream, group, name string, done chan error, n int64) {
	t.Helper()
	ctx := context.Background()
	rdb := b.rdb
	deadline := time.Now().Add(90 * time.Second)
	for {
		st, err := consumer.ReadStats(ctx, rdb, stream, group, []string{name})
		if err == nil && st[name].Events == n {
			return
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
			t.Fatalf("timed out after 90s: the meter consumer %s handled %d of %d events (stats error %v); %d entries pending; ledger rows: %s",
				name, st[name].Events, n, err, pending, rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
