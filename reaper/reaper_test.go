package reaper_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Pools and the emulator's keep-alive connections wind down after
		// their tests' cleanups.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("github.com/jackc/puddle/v2.(*Pool[...]).createIdleResources.func1"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// Reclaim while in flight: a consumer that is slow (Stripe takes 2 s) but
// alive keeps its entry: its heartbeat resets the entry's idle time and
// extends the ledger lease, so a reaper passing every 50 ms with a 200 ms
// min-idle never claims it.
func TestSlowAliveConsumerIsNeverClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 2 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Redis: b.rdb, DB: b.pool, Schema: testenv.SchemaOf(b.pool), Clock: b.clk, Stripe: b.stripe, Stream: b.stream, Group: b.group,
		Name: "slow-consumer", Namespace: testNamespace, Block: 20 * time.Millisecond,
		Lease: 600 * time.Millisecond, Logger: testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "reaper-a")
	cfg.MinIdle, cfg.Interval = 200*time.Millisecond, 50*time.Millisecond
	r := b.newReaper(t, cfg)
	ctx := context.Background()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e := ev(1)
	b.add(t, e)
	testenv.Eventually(t, 15*time.Second, func() bool {
		rec, ok := b.get(t, e)
		return ok && rec.Status == ledger.StatusCharged && len(b.pending(t)) == 0
	}, "the consumer charges and acks")
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if n := b.sim.ChargeCreates(); n != 1 {
		t.Fatalf("%d charge creates, want 1 (the reaper must not have re-driven it)", n)
	}
	k := b.kinds()
	if k[reaper.KindClaim] != 0 || k[reaper.KindRedriven] != 0 || k[reaper.KindClaimLost] != 0 {
		t.Fatalf("the reaper tried to claim a live consumer's entry: %v", k)
	}
	rec, _ := b.get(t, e)
	if rec.Attempts != 1 || rec.Epoch != 1 {
		t.Fatalf("the row was taken over: attempts %d, epoch %d", rec.Attempts, rec.Epoch)
	}
}

// Partial batch / killed process: a consumer read entries and died. With
// no ledger row, or a row whose lease expired, the reaper re-drives the
// entry exactly once: one charge, acked, row charged.
func TestDeadConsumerEntryRedrivenOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		row  bool // a pending row with an expired lease (killed mid-event)
	}{{"no ledger row", false}, {"expired lease", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			e := ev(7)
			b.add(t, e)
			b.read(t, deadName, 10)
			if tc.row {
				b.reserve(t, e, deadName, 30*time.Second)
				b.clk.Advance(time.Minute) // the dead consumer's lease runs out
			}
			b.waitIdle(t, 1, time.Millisecond)
			r := b.newReaper(t, b.config(t, "reaper-a"))
			sum, err := r.RunOnce(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if sum.Decisions[reaper.KindClaim] != 1 || sum.Outcomes[consumer.OutcomeCharged] != 1 {
				t.Fatalf("summary %+v, want one claim re-driven to charged", sum)
			}
			// A second pass finds nothing: the entry was acked.
			sum, err = r.RunOnce(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if sum.Scanned != 0 {
				t.Fatalf("second pass scanned %d entries", sum.Scanned)
			}
			if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
			if n := b.sim.ChargeCreates(); n != 1 {
				t.Fatalf("%d charge creates, want 1", n)
			}
			if p := b.pending(t); len(p) != 0 {
				t.Fatalf("still pending: %+v", p)
			}
			rec, ok := b.get(t, e)
			if !ok || rec.Status != ledger.StatusCharged {
				t.Fatalf("ledger row %+v (found %v), want charged", rec, ok)
			}
		})
	}
}

// AOF rollback: an entry that was billed and acked comes back as pending
// after a failover. The ledger row is terminal, so the reaper acks it
// without a Stripe call.
func TestAlreadyBilledEntryAckedWithoutStripeCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(3)
	b.charge(t, e)
	creates := b.sim.ChargeCreates()
	// The rollback: the entry is back in the stream and pending for a
	// consumer that no longer exists.
	b.add(t, e)
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, time.Millisecond)

	r := b.newReaper(t, b.config(t, "reaper-a"))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindAlreadyBilled] != 1 || sum.Decisions[reaper.KindClaim] != 0 {
		t.Fatalf("decisions %v, want one already_billed and no claim", sum.Decisions)
	}
	if got := b.sim.ChargeCreates(); got != creates {
		t.Fatalf("Stripe saw %d charge creates, want %d (no call)", got, creates)
	}
	if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
}

// Reclaim while in flight, without heartbeats: the PEL entry looks idle but
// the ledger lease is live. The reaper must not claim it (invariant 5).
func TestLiveLeaseIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(4)
	ids := b.add(t, e)
	b.read(t, "stalled-consumer", 10)
	b.reserve(t, e, "stalled-consumer", time.Hour)
	b.waitIdle(t, 1, time.Millisecond)
	before := b.snapshotLedger(t)

	r := b.newReaper(t, b.config(t, "reaper-a"))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindLeaseLive] != 1 || len(sum.Decisions) != 1 {
		t.Fatalf("decisions %v, want only lease_live", sum.Decisions)
	}
	p := b.pending(t)
	if len(p) != 1 || p[0].ID != ids[0] || p[0].Consumer != "stalled-consumer" || p[0].RetryCount != 1 {
		t.Fatalf("PEL %+v, want the entry untouched with stalled-consumer", p)
	}
	if !slices.Equal(before, b.snapshotLedger(t)) {
		t.Fatal("the ledger changed")
	}
	if n := b.sim.ChargeCreates(); n != 0 {
		t.Fatalf("%d charge creates, want 0", n)
	}
}

// A deleted (or trimmed) entry stays in the PEL with no body: acked and
// counted.
func TestDeletedEntryAckedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.add(t, ev(5), ev(6))
	b.read(t, deadName, 10)
	if err := b.rdb.XDel(context.Background(), b.stream, ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	b.charge(t, ev(6)) // the other one is billed, so the pass is all acks
	b.waitIdle(t, 2, time.Millisecond)

	metrics := reaper.NewMetrics(nil)
	cfg := b.config(t, "reaper-a")
	cfg.Metrics = metrics
	r := b.newReaper(t, cfg)
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindGone] != 1 || sum.Decisions[reaper.KindAlreadyBilled] != 1 {
		t.Fatalf("decisions %v, want one gone and one already_billed", sum.Decisions)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
	if n := metrics.Decisions(b.stream, reaper.KindGone); n != 1 {
		t.Fatalf("gone counter %v, want 1", n)
	}
}

// Poison messages: an entry delivered MaxDeliveries times goes to the dead
// letter stream with the reason, is acked, and raises an alert.
func TestMaxDeliveriesDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(8)
	ids := b.add(t, e)
	b.read(t, deadName, 10)
	// Two more deliveries (each XCLAIM counts one): 3 in all.
	for range 2 {
		if err := b.rdb.XClaim(context.Background(), &redis.XClaimArgs{Stream: b.stream, Group: b.group,
			Consumer: deadName, Messages: ids}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b.waitIdle(t, 1, time.Millisecond)
	cfg := b.config(t, "reaper-a")
	cfg.MaxDeliveries = 3
	r := b.newReaper(t, cfg)
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindMaxDeliveries] != 1 {
		t.Fatalf("decisions %v, want max_deliveries", sum.Decisions)
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Values["reason"] != consumer.ReasonMaxDelivery || dl[0].Values["source_id"] != ids[0] ||
		dl[0].Values["payload"] != e.Payload() {
		t.Fatalf("dead letters %+v", dl)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
	if a := b.notifier.Alerts(); len(a) != 1 || a[0].Title != "Reaper: max_deliveries" {
		t.Fatalf("alerts %+v, want one max_deliveries", a)
	}
	if n := b.sim.ChargeCreates(); n != 0 {
		t.Fatalf("%d charge creates, want 0", n)
	}
	if _, ok := b.get(t, e); ok {
		t.Fatal("a ledger row was written for a dead-lettered event")
	}
}

// A Stripe outage longer than MaxDeliveries passes: every re-drive fails
// transiently, and none of them counts as a delivery, so the entry is not
// dead-lettered; once Stripe is back it is charged exactly once.
func TestTransientRedrivesDoNotCountAsDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(9)
	b.add(t, e)
	b.read(t, deadName, 10) // delivery 1, then the consumer dies
	if err := b.sim.SetFaults(stripesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "reaper-a")
	cfg.MaxDeliveries = 2
	r := b.newReaper(t, cfg)
	for pass := range 4 {
		b.waitIdle(t, 1, time.Millisecond)
		sum, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if sum.Outcomes[consumer.OutcomeRetryLater] != 1 || sum.Decisions[reaper.KindMaxDeliveries] != 0 {
			t.Fatalf("pass %d: %+v, want one re-drive left for later and no dead letter", pass, sum)
		}
		if p := b.pending(t); len(p) != 1 || p[0].RetryCount != 1 || p[0].Consumer != "reaper-a" {
			t.Fatalf("pass %d: pending %+v, want the entry with its 1 delivery, held by the reaper", pass, p)
		}
	}
	if dl := b.deadLetters(t); len(dl) != 0 {
		t.Fatalf("dead letters during the outage: %+v", dl)
	}
	if err := b.sim.SetFaults(stripesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	b.waitIdle(t, 1, time.Millisecond)
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Outcomes[consumer.OutcomeCharged] != 1 {
		t.Fatalf("after the outage: %+v, want one charge", sum)
	}
	if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
	if rec, ok := b.get(t, e); !ok || rec.Status != ledger.StatusCharged {
		t.Fatalf("ledger row %+v (found %v), want charged", rec, ok)
	}
}

// Only Stripe outages are forgiven: a retry_later with a lasting cause
// (here a key that may not read charges, so the look-up past the key window
// answers 403) counts, and ends in a dead letter rather than a re-drive
// every --min-idle forever.
func TestLastingRetryLaterStillCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(10)
	b.add(t, e)
	b.read(t, deadName, 10)
	b.reserve(t, e, deadName, time.Minute) // first attempt, then the consumer died
	b.clk.Advance(25 * time.Hour)          // past the key window: the re-drive must look the charge up
	const rk = "rk_test_pelguard_no_charges_read"
	b.sim.SetKeyPermissions(rk, "payment_intents_write", "payment_intents_read")
	sc, err := stripeapi.New(stripeapi.Config{APIKey: rk, BaseURL: b.sim.URL(), MaxNetworkRetries: -1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config(t, "reaper-a")
	cfg.Stripe, cfg.MaxDeliveries = sc, 3
	r := b.newReaper(t, cfg)
	var dead int
	for pass := range 3 { // deliveries 2 and 3 fail; the third pass finds 3 ≥ MaxDeliveries
		b.waitIdle(t, 1, time.Millisecond)
		sum, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		dead += sum.Decisions[reaper.KindMaxDeliveries]
		if pass < 2 && sum.Outcomes[consumer.OutcomeRetryLater] != 1 {
			t.Fatalf("pass %d: %+v, want the look-up to fail and the entry left pending", pass, sum)
		}
	}
	if dead != 1 || len(b.deadLetters(t)) != 1 {
		t.Fatalf("%d max_deliveries decisions, %d dead letters; want 1 each", dead, len(b.deadLetters(t)))
	}
	if n := b.sim.ChargeCreates(); n != 0 {
		t.Fatalf("%d charge creates, want 0: the look-up never answered", n)
	}
}

// An invalid body is dead-lettered with the parser's reason and acked.
func TestInvalidEntryDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream,
		Values: map[string]any{"payload": `{"customer_id":"c_1"}`}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, time.Millisecond)
	r := b.newReaper(t, b.config(t, "reaper-a"))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindInvalid] != 1 {
		t.Fatalf("decisions %v", sum.Decisions)
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Values["reason"] != event.ReasonMissingField || dl[0].Values["source_id"] != id {
		t.Fatalf("dead letters %+v", dl)
	}
	if p := b.pending(t); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
}

// A billed row and a redelivered event that disagrees with it: never
// charged, never silently acked.
func TestConflictWithBilledRowDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(9)
	b.charge(t, e)
	other := e
	other.AmountCents += 500
	b.add(t, other)
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, time.Millisecond)
	r := b.newReaper(t, b.config(t, "reaper-a"))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindConflict] != 1 {
		t.Fatalf("decisions %v", sum.Decisions)
	}
	if dl := b.deadLetters(t); len(dl) != 1 || dl[0].Values["reason"] != consumer.ReasonConflict {
		t.Fatalf("dead letters %+v", dl)
	}
	if n := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// Two reapers at once over the same 1,000 abandoned entries: the min-idle
// fence on XCLAIM and the ledger's epoch keep every key to one charge.
func TestTwoReapersChargeEachKeyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 1000
	evs := make([]event.Event, n)
	for i := range evs {
		evs[i] = ev(i)
	}
	b.add(t, evs...)
	b.read(t, deadName, n)
	const minIdle = 50 * time.Millisecond
	b.waitIdle(t, n, minIdle)

	reapers := make([]*reaper.Reaper, 2)
	for i, name := range []string{"reaper-a", "reaper-b"} {
		cfg := b.config(t, name)
		cfg.MinIdle, cfg.Workers = minIdle, 16
		reapers[i] = b.newReaper(t, cfg)
	}
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for len(b.pending(t)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d entries still pending", len(b.pending(t)))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(reapers))
		for i, r := range reapers {
			wg.Go(func() { _, errs[i] = r.RunOnce(ctx) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// Entries a reaper claimed and left Busy (the other held the lease)
		// are acked from the ledger once they have been idle minIdle again.
		if len(b.pending(t)) > 0 {
			b.waitIdle(t, 1, minIdle)
		}
	}
	for _, e := range evs {
		if got := b.sim.SucceededCharges(e.CustomerID, e.BillingPeriod); got != 1 {
			t.Fatalf("%s charged %d times", ledger.EventKey(e), got)
		}
	}
	if d := b.sim.Duplicates(); len(d) != 0 {
		t.Fatalf("duplicates: %+v", d)
	}
	counts, err := b.ledger.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts[ledger.StatusCharged] != n || len(counts) != 1 {
		t.Fatalf("ledger %v, want %d charged rows", counts, n)
	}
	k := b.kinds()
	t.Logf("decisions: %v", k)
	if k[reaper.KindClaim] < n {
		t.Fatalf("only %d claims for %d entries", k[reaper.KindClaim], n)
	}
}

// Dry-run beside the old monitor: every decision is reported, and the PEL,
// the ledger, the dead-letter stream and Stripe stay exactly as they were.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.charge(t, ev(1))
	creates := b.sim.ChargeCreates()
	ids := b.add(t, ev(1), ev(2), ev(3), ev(4))
	if _, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream,
		Values: map[string]any{"payload": "not json"}}).Result(); err != nil {
		t.Fatal(err)
	}
	b.read(t, deadName, 10)
	b.reserve(t, ev(2), "stalled-consumer", time.Hour) // live lease
	if err := b.rdb.XDel(context.Background(), b.stream, ids[3]).Err(); err != nil {
		t.Fatal(err)
	}
	// ev(3): no row → would be claimed. Old consumers, idle, nothing pending:
	if err := b.rdb.XGroupCreateConsumer(context.Background(), b.stream, b.group, "old-idle").Err(); err != nil {
		t.Fatal(err)
	}
	b.waitIdle(t, 5, 5*time.Millisecond)

	pelBefore := b.pending(t)
	ledgerBefore := b.snapshotLedger(t)
	consumersBefore, err := b.rdb.XInfoConsumers(context.Background(), b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}

	cfg := b.config(t, "reaper-dry")
	cfg.DryRun, cfg.Stripe, cfg.ConsumerIdle = true, nil, time.Millisecond
	r := b.newReaper(t, cfg)
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[reaper.Kind]int{reaper.KindAlreadyBilled: 1, reaper.KindLeaseLive: 1, reaper.KindClaim: 1,
		reaper.KindGone: 1, reaper.KindInvalid: 1, reaper.KindRemoveConsumer: 1}
	for k, n := range want {
		if sum.Decisions[k] != n {
			t.Fatalf("decisions %v, want %v", sum.Decisions, want)
		}
	}
	for _, d := range b.decisions {
		if !d.DryRun {
			t.Fatalf("decision %+v not marked dry-run", d)
		}
	}

	pelAfter := b.pending(t)
	if len(pelAfter) != len(pelBefore) {
		t.Fatalf("PEL %d entries, was %d", len(pelAfter), len(pelBefore))
	}
	for i := range pelAfter {
		a, w := pelAfter[i], pelBefore[i]
		if a.ID != w.ID || a.Consumer != w.Consumer || a.RetryCount != w.RetryCount || a.Idle < w.Idle {
			t.Fatalf("PEL entry %+v, was %+v", a, w)
		}
	}
	if !slices.Equal(ledgerBefore, b.snapshotLedger(t)) {
		t.Fatal("the ledger changed")
	}
	if got := b.sim.ChargeCreates(); got != creates {
		t.Fatalf("charge creates %d, was %d", got, creates)
	}
	if dl := b.deadLetters(t); len(dl) != 0 {
		t.Fatalf("dead letters written: %+v", dl)
	}
	consumersAfter, err := b.rdb.XInfoConsumers(context.Background(), b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(consumersAfter) != len(consumersBefore) {
		t.Fatalf("consumers %+v, were %+v", consumersAfter, consumersBefore)
	}
	if a := b.notifier.Alerts(); len(a) != 0 {
		t.Fatalf("alerts sent in dry-run: %+v", a)
	}
}

// Hygiene: idle consumers with nothing pending are removed; one with
// pending entries, and the reaper's own name, are kept.
func TestConsumerHygiene(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, name := range []string{"gone-1", "gone-2"} {
		if err := b.rdb.XGroupCreateConsumer(ctx, b.stream, b.group, name).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b.add(t, ev(1))
	b.read(t, "stalled-consumer", 10)
	b.reserve(t, ev(1), "stalled-consumer", time.Hour)
	testenv.Eventually(t, 10*time.Second, func() bool {
		cs, err := b.rdb.XInfoConsumers(ctx, b.stream, b.group).Result()
		if err != nil {
			return false
		}
		for _, c := range cs {
			if c.Idle < 20*time.Millisecond {
				return false
			}
		}
		return true
	}, "consumers idle")
	// The liveness registry: gone-1 beat long ago (forgotten with its
	// removal), an old process that left the group long ago (forgotten),
	// one whose last beat is newer than the idle time, not a member yet
	// (kept), and the stalled
	// consumer, silent but holding an entry (kept: still a member).
	now := time.Now()
	for name, beat := range map[string]time.Time{"gone-1": now.Add(-time.Hour), "left-long-ago": now.Add(-48 * time.Hour),
		"just-started": now.Add(time.Minute), "stalled-consumer": now.Add(-time.Hour)} {
		if err := consumer.Register(ctx, b.rdb, b.stream, b.group, name, beat); err != nil {
			t.Fatal(err)
		}
	}
	cfg := b.config(t, "reaper-a")
	cfg.ConsumerIdle = 20 * time.Millisecond
	r := b.newReaper(t, cfg)
	sum, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindRemoveConsumer] != 2 {
		t.Fatalf("decisions %v, want 2 removals", sum.Decisions)
	}
	reg, err := consumer.Registered(ctx, b.rdb, b.stream, b.group)
	if err != nil {
		t.Fatal(err)
	}
	delete(reg, "reaper-a") // its own re-drives register it
	if _, ok := reg["gone-1"]; ok || len(reg) != 2 || reg["just-started"].IsZero() || reg["stalled-consumer"].IsZero() {
		t.Fatalf("registry after hygiene %v: want just-started and stalled-consumer only (and the reaper)", reg)
	}
	cs, err := b.rdb.XInfoConsumers(ctx, b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Name != "stalled-consumer" || cs[0].Pending != 1 {
		t.Fatalf("consumers left %+v, want only stalled-consumer with its entry", cs)
	}
}

// Start/Stop: Stop before Start is safe, Stop is idempotent, a second Start
// fails, Start after Stop fails.
func TestStartStopContract(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.newReaper(t, b.config(t, "reaper-a"))
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); !errors.Is(err, reaper.ErrStopped) {
		t.Fatalf("Start after Stop: %v", err)
	}

	r = b.newReaper(t, b.config(t, "reaper-b"))
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); !errors.Is(err, reaper.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	// It works while started: a dead consumer's entry is re-driven.
	e := ev(2)
	b.add(t, e)
	b.read(t, deadName, 10)
	testenv.Eventually(t, 10*time.Second, func() bool {
		rec, ok := b.get(t, e)
		return ok && rec.Status == ledger.StatusCharged && len(b.pending(t)) == 0
	}, "re-driven by the loop")
	for range 2 {
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, mut := range map[string]func(*reaper.Config){
		"no redis":        func(c *reaper.Config) { c.Redis = nil },
		"no streams":      func(c *reaper.Config) { c.Streams = nil },
		"no stripe":       func(c *reaper.Config) { c.Stripe = nil },
		"no group":        func(c *reaper.Config) { c.Streams[0].Group = "" },
		"duplicate":       func(c *reaper.Config) { c.Streams = append(c.Streams, c.Streams[0]) },
		"tiny min idle":   func(c *reaper.Config) { c.MinIdle = time.Microsecond },
		"too many":        func(c *reaper.Config) { c.Workers = 1000 },
		"huge page":       func(c *reaper.Config) { c.PageSize = 1 << 20 },
		"negative maxdel": func(c *reaper.Config) { c.MaxDeliveries = -1 },
	} {
		cfg := b.config(t, "x")
		mut(&cfg)
		if _, err := reaper.New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	cfg := b.config(t, "x")
	cfg.Stripe, cfg.DryRun = nil, true
	if _, err := reaper.New(cfg); err != nil {
		t.Fatalf("dry-run without Stripe: %v", err)
	}
}

// A billed event whose payload is valid but not in canonical form (fields
// reordered, currency left to its default) is still acked without a call.
func TestAlreadyBilledNonCanonicalPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := ev(11)
	b.charge(t, e)
	creates := b.sim.ChargeCreates()
	if err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": `{"billing_period":"2026-11","amount_cents":1011,` +
		`"stripe_customer_id":"cus_11","customer_id":"c_11","trace":"x"}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	b.read(t, deadName, 10)
	b.waitIdle(t, 1, time.Millisecond)
	r := b.newReaper(t, b.config(t, "reaper-a"))
	sum, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindAlreadyBilled] != 1 || len(b.pending(t)) != 0 || b.sim.ChargeCreates() != creates {
		t.Fatalf("decisions %v, pending %d, creates %d (was %d)", sum.Decisions, len(b.pending(t)), b.sim.ChargeCreates(), creates)
	}
}
