package ledger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// fenceWitness is a witness whose last rollback check ran on server
// (another server than the test's, at first: a failover behind a pooler),
// and whose Recheck, when it passes, makes the test's server the checked
// one.
type fenceWitness struct {
	server  atomic.Int64
	real    int64
	checks  atomic.Int32
	failing bool
}

func (w *fenceWitness) Writer() string       { return "test/serverfence" }
func (w *fenceWitness) Committed(int64)      {}
func (w *fenceWitness) CheckedServer() int64 { return w.server.Load() }
func (w *fenceWitness) Recheck(context.Context) error {
	w.checks.Add(1)
	if w.failing {
		return errors.New("the check found the ledger went back in time")
	}
	w.server.Store(w.real)
	return nil
}

// A ledger write whose transaction runs on a server the rollback check has
// not checked is rolled back, the check runs, and only then is the write
// made; when the check fails, nothing commits.
func TestNoWriteCommitsOnAnUncheckedServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, failing := range []bool{false, true} {
		b := setup(t)
		pool := testenv.DB(t)
		var real int64
		if err := pool.QueryRow(ctx, `SELECT `+ledger.ServerIdentitySQL).Scan(&real); err != nil {
			t.Fatal(err)
		}
		w := &fenceWitness{real: real, failing: failing}
		w.server.Store(real + 1) // the check last ran on the old primary
		b.l.SetWitness(w)
		e := ev("c1", 2500)
		c, err := b.l.Reserve(ctx, req(e, "A"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.l.Finish(ctx, c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_1"})
		rec, gerr := b.l.Get(ctx, c.Record.Key)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if w.checks.Load() != 1 {
			t.Fatalf("failing check %v: %d checks, want 1 before the write", failing, w.checks.Load())
		}
		switch {
		case !failing && (err != nil || rec.Status != ledger.StatusCharged):
			t.Fatalf("after a passing check the write must land: %v, status %s", err, rec.Status)
		case failing && (!errors.Is(err, ledger.ErrUncheckedServer) || rec.Status != ledger.StatusPending):
			t.Fatalf("with a failing check nothing may commit: %v, status %s", err, rec.Status)
		}
	}
}
