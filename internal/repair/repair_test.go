package repair_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	ns     = "repair-test"
	period = "2026-11"
	simKey = "sk_test_repair000000000001"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type world struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	clk    *clock.Sim
	l      *ledger.Ledger
	sim    *stripesim.Server
	sc     *stripeapi.Client
}

// setup is a migrated schema, a ledger on a simulated clock and an
// emulator on the same time, whose debit customers' charges stay pending.
func setup(t *testing.T, debits ...string) *world {
	t.Helper()
	pool := testenv.DB(t)
	clk := clock.NewSim(t0)
	sim := stripesim.MustNew(stripesim.Config{Now: t0, Faults: stripesim.Faults{DebitCustomers: debits}})
	t.Cleanup(sim.Close)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: simKey, BaseURL: sim.URL(), MaxNetworkRetries: stripeapi.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, pool: pool, schema: testenv.SchemaOf(pool), clk: clk, l: ledger.New(pool, testenv.SchemaOf(pool), clk), sim: sim, sc: sc}
}

func ev(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i),
		AmountCents: int64(1000 + i), BillingPeriod: period, Currency: "usd"}
}

// bill does what a consumer does for e: reserve (holder "A"), charge at
// Stripe with pelguard's metadata, and, when finish, record the outcome.
// A Reserve without finish is a row whose outcome the failover erased.
func (w *world) bill(e event.Event, finish bool) (ledger.Claim, stripeapi.Charge) {
	w.t.Helper()
	ctx := context.Background()
	key := e.Key(ns)
	claim, err := w.l.Reserve(ctx, ledger.ReserveRequest{Event: e, IdempotencyKey: key, Owner: "A", Lease: time.Minute, MessageID: "1-0"})
	if err != nil || claim.Decision != ledger.Acquired {
		w.t.Fatalf("reserving %s: %+v %v", e.CustomerID, claim, err)
	}
	ch, err := w.sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: key, StripeCustomerID: e.StripeCustomerID,
		AmountCents: e.AmountCents, Currency: e.Currency, Description: "Usage billing for " + e.BillingPeriod,
		Metadata: stripeapi.PelguardMetadata(e.CustomerID, e.BillingPeriod, key)})
	if err != nil {
		w.t.Fatalf("charging %s: %v", e.CustomerID, err)
	}
	if finish {
		out := ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch.ID, PaymentIntentID: ch.PaymentIntentID}
		if ch.Status == "pending" {
			out.Status, out.PollAt = ledger.StatusProcessing, w.clk.Now().Add(time.Hour)
		}
		if claim.Record, err = w.l.Finish(ctx, claim.Record, out); err != nil {
			w.t.Fatalf("recording %s: %v", e.CustomerID, err)
		}
	}
	return claim, ch
}

func (w *world) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.pool.Exec(context.Background(), sql, args...); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
}

// lose is what a failover to an asynchronous replica does to the rows of
// keys: their last commits are gone.
func (w *world) lose(es ...event.Event) {
	w.t.Helper()
	for _, e := range es {
		w.exec(`DELETE FROM billing_records WHERE customer_id = $1 AND billing_period = $2`, e.CustomerID, e.BillingPeriod)
	}
}

func (w *world) row(e event.Event) (ledger.Record, bool) {
	w.t.Helper()
	r, err := w.l.Get(context.Background(), ledger.EventKey(e))
	if errors.Is(err, ledger.ErrNotFound) {
		return r, false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return r, true
}

func (w *world) int(sql string, args ...any) int64 {
	w.t.Helper()
	var n int64
	if err := w.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// posts counts the requests that could move money: every POST.
func (w *world) posts() int64 {
	var n int64
	for k, v := range w.sim.Requests() {
		if strings.HasPrefix(k, "POST ") {
			n += v
		}
	}
	return n
}

func (w *world) cfg() repair.Config {
	return repair.Config{Ledger: w.l, Stripe: w.sc, Since: t0.Add(-time.Hour), Namespace: ns, By: "test",
		Logger: testenv.Logger(w.t)}
}

// The failover: rows lost, rows taken back to pending or processing, a
// refund_ledger row lost, the spend cap's reservations lost, the fence
// raised past every epoch the lost history could have handed out. The
// repair brings every key back in line with Stripe, never charges or
// refunds, fences the holders from before, and a rerun changes nothing.
func TestRepairRebuildsWhatAFailoverLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, "cus_3", "cus_4", "cus_5")
	if _, err := w.l.SetCap(ctx, period, 1_000_000); err != nil {
		t.Fatal(err)
	}
	e := make([]event.Event, 10)
	for i := range e {
		e[i] = ev(i)
	}
	_, ch1 := w.bill(e[1], true)       // charged, row lost
	claim2, ch2 := w.bill(e[2], false) // charged, its record lost: pending with A's lease
	_, ch3 := w.bill(e[3], false)      // a debit in motion, its record lost: pending
	_, ch4 := w.bill(e[4], true)       // a debit recorded processing, row lost
	claim5, ch5 := w.bill(e[5], true)  // a debit recorded processing, settled at Stripe, the settlement lost
	_, ch6 := w.bill(e[6], true)       // charged, then refunded in full by hand, row lost
	if claim5.Record.Status != ledger.StatusProcessing || ch3.Status != "pending" || ch4.Status != "pending" {
		t.Fatalf("debits: %s %s %s", claim5.Record.Status, ch3.Status, ch4.Status)
	}
	if err := w.sim.Settle(ch5.ID, true, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := w.sim.RefundByHand(ch6.ID, 0); err != nil {
		t.Fatal(err)
	}
	// c7: a duplicate made first, then the key's charge; pelguard refunded
	// part of the duplicate (all it still held at the audit), so the
	// duplicate is the earliest charge that holds money. The refund's
	// refund_ledger row is lost with c7's row: only the rebuilt
	// refund_ledger tells the repair that it is not c7's charge.
	dup, err := w.sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: "dup-c7", StripeCustomerID: e[7].StripeCustomerID,
		AmountCents: e[7].AmountCents, Currency: "usd", Metadata: stripeapi.PelguardMetadata(e[7].CustomerID, period, e[7].Key(ns))})
	if err != nil {
		t.Fatal(err)
	}
	w.sim.Advance(time.Second)
	_, ch7 := w.bill(e[7], true)
	re, err := w.sc.RefundCharge(ctx, stripeapi.RefundRequest{ChargeID: dup.ID, AmountCents: 500, IdempotencyKey: "pelguard-refund-" + dup.ID,
		Source: "auditor refund", CustomerID: e[7].CustomerID, BillingPeriod: period})
	if err != nil {
		t.Fatal(err)
	}
	claim8, _ := w.l.Reserve(ctx, ledger.ReserveRequest{Event: e[8], IdempotencyKey: e[8].Key(ns), Owner: "A", Lease: time.Minute, MessageID: "2-0"})
	_, ch9 := w.bill(e[9], true) // charged, survived

	// The failover.
	w.lose(e[1], e[4], e[6], e[7])
	w.exec(`UPDATE spend_caps SET reserved_cents = 0`)
	w.exec(`UPDATE ledger_fence SET epoch_floor = 1000`)
	if n := w.int(`SELECT count(*) FROM refund_ledger`); n != 0 {
		t.Fatalf("refund_ledger has %d rows before the repair", n)
	}
	before8, _ := w.row(e[8])
	before9, _ := w.row(e[9])
	charges, posts := w.sim.ChargeCreates(), w.posts()

	var progress testenv.SyncBuffer
	cfg := w.cfg()
	cfg.Progress = &progress
	rep, err := repair.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rebuilt != 3 || rep.Repaired != 3 || rep.RefundsRebuilt != 1 || rep.Findings != 1 || len(rep.Keys) != 6 || rep.RefundsUnread {
		t.Fatalf("report %+v: want 3 rebuilt (c1, c4, c7), 3 repaired (c2, c3, c5), 1 refund, 1 finding (c6)", rep)
	}
	if got, want := w.sim.ChargeCreates(), charges; got != want {
		t.Fatalf("the repair made %d charges", got-want)
	}
	if got := w.posts(); got != posts {
		t.Fatalf("the repair sent %d POSTs to Stripe: it only reads", got-posts)
	}
	if !strings.Contains(progress.String(), "repair: reading charges since") {
		t.Fatalf("progress:\n%s", progress.String())
	}

	for _, c := range []struct {
		e      event.Event
		status ledger.Status
		charge string
	}{
		{e[1], ledger.StatusCharged, ch1.ID}, {e[2], ledger.StatusCharged, ch2.ID}, {e[3], ledger.StatusProcessing, ch3.ID},
		{e[4], ledger.StatusProcessing, ch4.ID}, {e[5], ledger.StatusCharged, ch5.ID}, {e[7], ledger.StatusCharged, ch7.ID},
	} {
		r, ok := w.row(c.e)
		switch {
		case !ok:
			t.Fatalf("%s: no row", c.e.CustomerID)
		case r.Status != c.status || r.ChargeID != c.charge || r.LeaseOwner != "" || r.Epoch <= 1000:
			t.Fatalf("%s: %s %s epoch %d lease %q; want %s %s, no lease, an epoch past the fence's floor",
				c.e.CustomerID, r.Status, r.ChargeID, r.Epoch, r.LeaseOwner, c.status, c.charge)
		case r.AmountCents != c.e.AmountCents || r.StripeCustomerID != c.e.StripeCustomerID || r.IdempotencyKey != c.e.Key(ns):
			t.Fatalf("%s: %+v", c.e.CustomerID, r)
		case c.status == ledger.StatusProcessing && r.NextPollAt.IsZero():
			t.Fatalf("%s: processing without a poll", c.e.CustomerID)
		case r.CapReservedCents != c.e.AmountCents:
			t.Fatalf("%s reserves %d, want %d", c.e.CustomerID, r.CapReservedCents, c.e.AmountCents)
		}
	}
	if _, ok := w.row(e[6]); ok {
		t.Fatal("c6, whose only charge is fully refunded, was recorded")
	}
	if n := w.int(`SELECT count(*) FROM audit_findings WHERE kind = 'refunded_only' AND subject = $1 AND charge_id = $2 AND state = 'open'`,
		e[6].Key(ns), ch6.ID); n != 1 {
		t.Fatalf("%d refunded_only findings for c6", n)
	}
	if after8, _ := w.row(e[8]); after8.Status != ledger.StatusPending || after8.Epoch != before8.Epoch ||
		after8.LeaseOwner != "A" || !after8.UpdatedAt.Equal(before8.UpdatedAt) {
		t.Fatalf("c8 (in flight, never charged) was touched: %+v", after8)
	}
	if after9, _ := w.row(e[9]); after9.ChargeID != ch9.ID || !after9.UpdatedAt.Equal(before9.UpdatedAt) {
		t.Fatalf("c9 (charged, survived) was touched: %+v", after9)
	}
	var refundedAt time.Time
	var source string
	if err := w.pool.QueryRow(ctx, `SELECT refunded_at, source FROM refund_ledger WHERE refund_id = $1 AND charge_id = $2 AND amount_cents = 500`,
		re.ID, dup.ID).Scan(&refundedAt, &source); err != nil || source != ledger.RefundSourceRebuilt || !refundedAt.Equal(re.Created) {
		t.Fatalf("refund_ledger: %v %q %v (want the refund's time %v)", err, source, refundedAt, re.Created)
	}
	sum := w.int(`SELECT sum(cap_reserved_cents) FROM billing_records WHERE billing_period = $1`, period)
	if want := int64(1001 + 1002 + 1003 + 1004 + 1005 + 1007 + 1008 + 1009); sum != want {
		t.Fatalf("rows reserve %d, want %d", sum, want)
	}
	if c, _ := w.l.Cap(ctx, period); c.ReservedCents != sum {
		t.Fatalf("the cap reserves %d, its rows %d", c.ReservedCents, sum)
	}

	// The holders from before the failover are fenced out.
	if _, err := w.l.Finish(ctx, claim2.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: ch2.ID}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("c2's holder from before the failover finished: %v", err)
	}
	if err := w.l.Extend(ctx, claim2.Record, time.Minute); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("c2's holder from before the failover extended its lease: %v", err)
	}
	if _, err := w.l.Settle(ctx, ledger.EventKey(e[5]), ledger.Settlement{ChargeID: ch5.ID, Succeeded: true}); !errors.Is(err, ledger.ErrNotInMotion) {
		t.Fatalf("c5's settlement after the repair: %v", err)
	}
	if claim8.Record.Epoch != before8.Epoch {
		t.Fatal("c8's holder lost its epoch")
	}

	// A rerun changes nothing.
	snap := testenv.Snapshot(t, w.pool, w.schema)
	rep2, err := repair.Run(ctx, w.cfg())
	if err != nil {
		t.Fatal(err)
	}
	if rep2.Rebuilt+rep2.Repaired+rep2.RefundsRebuilt != 0 || len(rep2.Keys) != 0 || rep2.Findings != 1 {
		t.Fatalf("rerun report %+v", rep2)
	}
	if got := testenv.Snapshot(t, w.pool, w.schema); got != snap {
		t.Fatalf("the rerun changed the ledger:\nbefore:\n%s\nafter:\n%s", snap, got)
	}
	if got := w.sim.ChargeCreates(); got != charges {
		t.Fatalf("the reruns made %d charges", got-charges)
	}
}

// Two processes repairing at once (every role runs the repair) record
// everything once: no double insert, no double reservation, one finding.
func TestTwoRepairsAtOnceRecordEverythingOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, "cus_3")
	if _, err := w.l.SetCap(ctx, period, 1_000_000); err != nil {
		t.Fatal(err)
	}
	var es []event.Event
	for i := 1; i <= 40; i++ {
		es = append(es, ev(i))
	}
	for i, e := range es {
		w.bill(e, i%4 != 1) // every fourth: its record lost, the row pending
	}
	w.lose(es[10:30]...)
	// Duplicates of three keys, refunded by pelguard; refund_ledger lost them.
	refunds := 0
	for _, e := range es[30:33] {
		dup, err := w.sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: "dup-" + e.CustomerID, StripeCustomerID: e.StripeCustomerID,
			AmountCents: e.AmountCents, Currency: "usd", Metadata: stripeapi.PelguardMetadata(e.CustomerID, period, e.Key(ns))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.sc.Refund(ctx, dup.ID, 0, "pelguard-refund-"+dup.ID); err != nil {
			t.Fatal(err)
		}
		refunds++
	}
	w.exec(`UPDATE spend_caps SET reserved_cents = 0`)
	pendingLeft := 0 // rows whose record was lost and that survived as pending
	for i := range es {
		if i%4 == 1 && (i < 10 || i >= 30) {
			pendingLeft++
		}
	}
	charges := w.sim.ChargeCreates()

	reps := make([]repair.Report, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := w.cfg()
			cfg.Ledger = ledger.New(w.pool, w.schema, w.clk) // another process
			cfg.By = fmt.Sprintf("process-%d", i)
			reps[i], errs[i] = repair.Run(ctx, cfg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rebuilt, repaired, refundsRebuilt := reps[0].Rebuilt+reps[1].Rebuilt, reps[0].Repaired+reps[1].Repaired, reps[0].RefundsRebuilt+reps[1].RefundsRebuilt
	if rebuilt != 20 || repaired != pendingLeft || refundsRebuilt != refunds {
		t.Fatalf("together: %d rebuilt, %d repaired, %d refunds; want 20, %d, %d (%+v / %+v)",
			rebuilt, repaired, refundsRebuilt, pendingLeft, refunds, reps[0], reps[1])
	}
	if n := w.int(`SELECT count(*) FROM billing_records WHERE status IN ('charged', 'processing')`); n != int64(len(es)) {
		t.Fatalf("%d rows charged or processing, want %d", n, len(es))
	}
	if n := w.int(`SELECT count(*) FROM refund_ledger`); n != int64(refunds) {
		t.Fatalf("%d refund_ledger rows, want %d", n, refunds)
	}
	sum := w.int(`SELECT sum(cap_reserved_cents) FROM billing_records`)
	var want int64
	for _, e := range es {
		want += e.AmountCents
	}
	if c, _ := w.l.Cap(ctx, period); sum != want || c.ReservedCents != want {
		t.Fatalf("rows reserve %d, the cap %d; want %d", sum, c.ReservedCents, want)
	}
	if got := w.sim.ChargeCreates(); got != charges {
		t.Fatalf("the repairs made %d charges", got-charges)
	}
	snap := testenv.Snapshot(t, w.pool, w.schema)
	if rep, err := repair.Run(ctx, w.cfg()); err != nil || rep.Rebuilt+rep.Repaired+rep.RefundsRebuilt != 0 {
		t.Fatalf("a third repair: %+v %v", rep, err)
	}
	if got := testenv.Snapshot(t, w.pool, w.schema); got != snap {
		t.Fatal("a third repair changed the ledger")
	}
}
