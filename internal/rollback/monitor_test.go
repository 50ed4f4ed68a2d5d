package rollback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

func TestCompareFindsOnlyValuesAboveTheLedger(t *testing.T) {
	t.Parallel()
	got := rollback.Compare(map[string]int64{"a": 5, "b": 9, "c": 3}, map[string]int64{"a": 7, "b": 4, "d": 2, "c": 3})
	want := []rollback.Loss{{Writer: "a", Ledger: 5, Witnessed: 7}, {Writer: "d", Ledger: 0, Witnessed: 2}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Compare = %v, want %v", got, want)
	}
	if e := rollback.Evidence(got); e != "a: ledger at 5, witnessed 7 (2 commits lost); d: ledger at 0, witnessed 2 (2 commits lost)" {
		t.Fatalf("Evidence = %q", e)
	}
}

type world struct {
	pool   *pgxpool.Pool
	schema string
	notes  *alerts.Memory
}

func newWorld(t *testing.T) world {
	pool := testenv.DB(t)
	return world{pool: pool, schema: testenv.SchemaOf(pool), notes: alerts.NewMemory()}
}

func (w world) monitor(t *testing.T, writer string, repair rollback.RepairFunc) *rollback.Monitor {
	t.Helper()
	m, err := rollback.New(rollback.Config{Schema: w.schema, Writer: writer, Redis: testenv.Redis(t), Notifier: w.notes,
		Logger: testenv.Logger(t), Repair: repair, Every: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close) // before the pool closes: cleanups run last first
	return m
}

func ev(cust string) event.Event {
	return event.Event{CustomerID: cust, StripeCustomerID: "cus_" + cust, AmountCents: 500, BillingPeriod: "2026-11", Currency: "usd"}
}

// TestAWitnessedCommitThatIsGoneIsARollback plays what a failover to an
// asynchronous replica does to the ledger (the witness rows and the last
// rows go back), and checks that a process that never saw the lost commits
// (its memory empty) detects it from Redis's mirror, fences, alerts once,
// and that a stale holder can no longer write.
func TestAWitnessedCommitThatIsGoneIsARollback(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	consumerMon := w.monitor(t, "consumer/a", nil)
	if err := consumerMon.Start(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(w.pool, w.schema, nil)
	l.SetWitness(consumerMon)

	// Three charges recorded and mirrored (each before its XACK).
	for _, c := range []string{"c1", "c2", "c3"} {
		claim, err := l.Reserve(ctx, ledger.ReserveRequest{Event: ev(c), IdempotencyKey: ev(c).Key("t"), Owner: "a", Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Finish(ctx, claim.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_" + c}); err != nil {
			t.Fatal(err)
		}
		if err := consumerMon.Mirror(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth is in flight: reserved, its holder inside the Stripe call.
	held, err := l.Reserve(ctx, ledger.ReserveRequest{Event: ev("c4"), IdempotencyKey: ev("c4").Key("t"), Owner: "a", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// The failover: the last two charges' commits (and their witness
	// bumps) never reached the replica that is now the primary.
	q := func(sql string, args ...any) {
		t.Helper()
		if _, err := w.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	q(`DELETE FROM ` + w.schema + `.billing_records WHERE customer_id IN ('c2', 'c3')`)
	q(`UPDATE ` + w.schema + `.ledger_witness SET seq = 1 WHERE writer = 'consumer/a'`)

	reaperMon := w.monitor(t, "reaper/r", nil)
	if err := reaperMon.Start(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	if !reaperMon.Suspect() {
		t.Fatal("the reaper's monitor did not detect the rollback from Redis's mirror")
	}
	if err := consumerMon.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if !consumerMon.Suspect() {
		t.Fatal("the consumer's monitor does not see the open rollback")
	}
	var n, fenced int64
	var evidence string
	if err := w.pool.QueryRow(ctx, `SELECT count(*), max(rows_fenced), max(evidence) FROM `+w.schema+`.ledger_rollbacks`).Scan(&n, &fenced, &evidence); err != nil {
		t.Fatal(err)
	}
	if n != 1 || fenced != 1 || evidence != "consumer/a: ledger at 1, witnessed 3 (2 commits lost)" {
		t.Fatalf("ledger_rollbacks: %d rows, %d fenced, evidence %q; want 1 row, 1 fenced (c4), the consumer's 2 lost commits", n, fenced, evidence)
	}
	if got := kinds(w.notes.Alerts()); got[alerts.KindLedgerRollback] != 1 {
		t.Fatalf("alerts: %v, want one ledger_rollback", got)
	}
	// The holder from before the fence can no longer record anything.
	_, err = l.Finish(ctx, held.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: "ch_c4"})
	if !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("a holder from before the rollback finished: %v, want ErrLeaseLost", err)
	}
	// A lost row inserted again gets an epoch above every one issued before.
	again, err := l.Reserve(ctx, ledger.ReserveRequest{Event: ev("c2"), IdempotencyKey: ev("c2").Key("t"), Owner: "b", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if again.Decision != ledger.Acquired || again.Record.Epoch <= 1<<32 || again.Record.TakenOverInAttempt() {
		t.Fatalf("re-inserted row: %v epoch %d (taken over: %v), want acquired above the floor", again.Decision, again.Record.Epoch, again.Record.TakenOverInAttempt())
	}
	// A later check by either sees the same evidence as recorded: no
	// second rollback.
	for _, m := range []*rollback.Monitor{consumerMon, reaperMon} {
		if err := m.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM `+w.schema+`.ledger_rollbacks`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("ledger_rollbacks: %d rows (%v), want still 1", n, err)
	}
}

// TestTheFleetRepairsAndReopensBilling: an open rollback is repaired once
// by a process with a repair function, closed with its counts, announced,
// and the fleet stops asking Stripe before every charge.
func TestTheFleetRepairsAndReopensBilling(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := w.pool.Exec(ctx, `INSERT INTO `+w.schema+`.ledger_rollbacks (detected_at, detected_by, evidence, lost_since, epoch_floor)
		VALUES (now(), 'test', 'x: ledger at 1, witnessed 2', now() - interval '1 minute', 0)`); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	repair := func(ctx context.Context, since time.Time) (rollback.RepairReport, error) {
		if calls.Add(1) == 1 {
			return rollback.RepairReport{}, errors.New("stripe unreachable")
		}
		return rollback.RepairReport{Rebuilt: 3, Repaired: 1, RefundsRebuilt: 1}, nil
	}
	watcher := w.monitor(t, "console/x", nil)
	if err := watcher.Start(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	if !watcher.Suspect() {
		t.Fatal("an open rollback is not suspect")
	}
	fixer := w.monitor(t, "consumer/f", repair)
	if err := fixer.Start(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { _ = watcher.Check(ctx); return !watcher.Suspect() },
		"the rollback was never repaired")
	var rebuilt, repaired int
	var lastErr *string
	if err := w.pool.QueryRow(ctx, `SELECT rows_rebuilt, rows_repaired, last_error FROM `+w.schema+`.ledger_rollbacks`).Scan(&rebuilt, &repaired, &lastErr); err != nil {
		t.Fatal(err)
	}
	if rebuilt != 3 || repaired != 1 || lastErr != nil || calls.Load() != 2 {
		t.Fatalf("rollback row: rebuilt %d repaired %d last_error %v after %d repairs; want 3, 1, none, 2 (one failure, one retry)", rebuilt, repaired, lastErr, calls.Load())
	}
	if got := kinds(w.notes.Alerts()); got[alerts.KindLedgerRepaired] != 1 {
		t.Fatalf("alerts %v, want one ledger_repaired", got)
	}
}

func kinds(as []alerts.Alert) map[alerts.Kind]int {
	out := map[alerts.Kind]int{}
	for _, a := range as {
		out[a.Kind]++
	}
	return out
}
