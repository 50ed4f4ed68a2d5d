package rollback_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestWitnessRowsOfGoneWritersArePruned: the witness grows by one row (and
// one Redis hash field) per process ever started; a writer idle for
// PruneAfter is deleted from both, a recent one stays.
func TestWitnessRowsOfGoneWritersArePruned(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var ledgerID string
	if err := w.pool.QueryRow(ctx, `SELECT ledger_id FROM `+w.schema+`.ledger_fence`).Scan(&ledgerID); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	key := "pelguard:ledger-witness:" + ledgerID
	testenv.CleanupKeys(t, rdb, key)
	old, recent := "consumer/pod-gone-a-week", "consumer/pod-recent"
	if _, err := w.pool.Exec(ctx, `INSERT INTO `+w.schema+`.ledger_witness (writer, seq, updated_at) VALUES ($1, 7, $2), ($3, 9, $4)`,
		old, time.Now().Add(-rollback.PruneAfter-time.Hour), recent, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, old, 7, recent, 9).Err(); err != nil {
		t.Fatal(err)
	}
	m := w.monitor(t, "reaper/test", nil)
	if err := m.Start(ctx, w.pool); err != nil { // the first loop prunes
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		_ = w.pool.QueryRow(ctx, `SELECT count(*) FROM `+w.schema+`.ledger_witness WHERE writer = $1`, old).Scan(&n)
		return n == 0
	}, "the row of a writer idle for %s is pruned", rollback.PruneAfter)
	if rdb.HExists(ctx, key, old).Val() {
		t.Error("the pruned writer is still in Redis's mirror")
	}
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+w.schema+`.ledger_witness WHERE writer = $1`, recent).Scan(&n); err != nil || n != 1 {
		t.Errorf("the recent writer's row: %d (%v), want kept", n, err)
	}
}
