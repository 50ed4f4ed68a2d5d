package rollback_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/meterwitness"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/pgfailover"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// Usage through a Postgres failover that loses delivered meter event rows:
// two meter consumers and the reaper send usage, the replica stalls, they
// send more (rows committed, entries acked, never replicated), the primary
// dies and the replica is promoted. Stripe counted every event; the ledger
// lost their rows and their share of meter_usage. With no command run,
// the repair must restore every lost row (from the meter witness) so that
// each customer's delivered total equals Stripe's, and nothing is counted
// twice.
func TestUsageThroughAFailoverThatLosesDeliveredRows(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{})
}

// The same with Redis rolled back too, halfway through the stall: the
// second half's acks and witnesses are gone, their entries are read again,
// and within Stripe's identifier window they are sent again under their
// identifiers (refused as duplicates: delivered).
func TestUsageThroughAFailoverWithRedisRolledBackToo(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true})
}

// The same, with a day's outage between the failover and the repair (the
// emulator's clock and the fleet's moved 25 h): the first half comes back
// from the witness as delivered; the second half, whose acks Redis lost
// and whose identifiers Stripe has forgotten, is parked and named in the
// repair's report — never counted twice.
func TestUsageThroughAFailoverAndADayOutage(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true, dayOutage: true})
}

type meterDrillOpts struct {
	redisRollsBack bool
	dayOutage      bool
	// fromLedger: the consumers record at ingest and send from the ledger;
	// aggregate: and aggregate the meter per second (Stripe then records
	// fewer events than were produced: counted by totals).
	fromLedger, aggregate bool
	// inFlight (with redisRollsBack and aggregate): the first call of the
	// first inFlight customers in the first half of the stall is held at
	// the emulator until Redis's rollback point is taken, so their
	// aggregates are in flight then (witnessed before the call, recorded
	// by Stripe after), and one more event of each is ingested behind it
	// (holdInFlight). The consumers then take one customer-meter per
	// round, so a held call holds no one else's.
	inFlight int
}

// The same with consumers that send from the ledger: the failover also
// loses ingested-but-unsent rows (their entries acked) and rows sending.
func TestUsageThroughAFailoverFromTheLedger(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true, fromLedger: true})
}

// And with per-second aggregates: aggregates in flight are lost too; the
// repair restores them from the witness (identifier and members, written
// before their first call) and they are re-sent under their identifiers.
func TestUsageThroughAFailoverWithAggregates(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{fromLedger: true, aggregate: true})
}

// And with Redis rolled back too: the second half's aggregates are lost
// from both stores with their witnesses and acks; their entries are read
// again with the same ids, so the same arrival buckets form the same
// aggregates under the same identifiers, refused by Stripe as duplicates
// (delivered): each customer counted once.
func TestUsageThroughAFailoverWithAggregatesAndRedisRolledBack(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true, fromLedger: true, aggregate: true})
}

const (
	meterDrillMeter     = "api_calls"
	meterDrillCustomers = 9
	meterBefore         = 40 // sent and replicated before the stall
	meterStallA         = 40 // sent during the stall: acked, witnessed; rows lost
	meterStallB         = 40 // sent during the stall after Redis's rollback point
	meterAfter          = 20 // sent after the failover
)

type meterDrillEvent struct {
	event.MeterEvent
	phase string
}

// failoverSlots bounds the package's failover drills running at once: each
// starts its own primary and replica (initdb, base backup), and five at
// once on two loaded cores pass the kit's 30 s start-up bound.
var failoverSlots = make(chan struct{}, 2)

// failoverSlot waits for a slot, given back once the test's clusters are
// gone (its cleanups run before this one).
func failoverSlot(t *testing.T) {
	t.Helper()
	failoverSlots <- struct{}{}
	t.Cleanup(func() { <-failoverSlots })
}

func meterDrill(t *testing.T, o meterDrillOpts) {
	failoverSlot(t)
	cl := pgfailover.Start(t, pgfailover.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
	defer cancel()
	const schema = "pelguard"
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := clock.NewSim(t0)
	held := newHeldCalls(t, o.inFlight)
	sim, err := stripesim.New(stripesim.Config{Now: t0, Seed: 11, OnMeterEventInFlight: held.hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterDrillMeter}); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetFaults(stripesim.Faults{MeterEventLatency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	timeout, workers := 10*time.Second, 0
	if o.inFlight > 0 {
		// A held call outlasts no client timeout: it is in flight, not lost.
		timeout, workers = 90*time.Second, 1
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: drillKey, BaseURL: sim.URL(), MaxNetworkRetries: -1, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "meterfailover")
	const group = "usage"
	testenv.CleanupKeys(t, rdb, stream, consumer.DeadLetterStream(stream), meterwitness.Key(stream, group),
		consumer.LivenessKey(stream, group))
	if err := consumer.EnsureGroup(ctx, rdb, stream, group); err != nil {
		t.Fatal(err)
	}
	{
		admin, err := pgxpool.New(ctx, cl.URL())
		if err != nil {
			t.Fatal(err)
		}
		m, err := migrations.New(admin, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Up(ctx); err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
		admin.Close()
	}
	if err := cl.WaitReplicaCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	notes := alerts.NewMemory()
	// The repair waits for the gate: opened once the test has read what
	// the failover lost (a repair quicker than that read would hide the
	// loss), and, after a day's outage, once the clocks have moved.
	gate := make(chan struct{})

	type proc struct {
		mon  *rollback.Monitor
		pool *pgxpool.Pool
	}
	repairer := func(name string, ml *meterledger.Ledger) rollback.RepairFunc {
		return func(ctx context.Context, since time.Time) (rollback.RepairReport, error) {
			select {
			case <-gate:
			case <-ctx.Done():
				return rollback.RepairReport{}, ctx.Err()
			}
			u, err := repair.Usage(ctx, repair.UsageConfig{Ledger: ml, Redis: rdb, Since: since, By: name, Logger: testenv.Logger(t)})
			return cli.AddUsage(rollback.RepairReport{}, u, err)
		}
	}
	newProc := func(name string) proc {
		t.Helper()
		mon, err := rollback.New(rollback.Config{Schema: schema, Writer: name, Redis: rdb, Notifier: notes,
			Logger: testenv.Logger(t), Clock: clk, Every: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(cl.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns, cfg.AfterConnect = 8, mon.AfterConnect
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ml, err := meterledger.New(pool, meterledger.Config{Schema: schema, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		if o.dayOutage && !strings.HasPrefix(name, "reaper/") {
			// One repairer: a repair held at the gate while the clock
			// jumps a day would look stale to the others, which would
			// repair beside it (harmless, but its counts would be split).
			mon.SetRepair(nil)
		} else {
			mon.SetRepair(repairer(name, ml))
		}
		if err := mon.Start(ctx, pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mon.Close(); pool.Close() })
		return proc{mon: mon, pool: pool}
	}
	procs := []proc{newProc("meter-events/a"), newProc("meter-events/b"), newProc("reaper/r")}

	// The workers: two meter consumers and a reaper, each on its
	// process's pool and witness. stopWorkers ends them (a day's outage).
	var stopWorkers func()
	startWorkers := func(gen int) {
		t.Helper()
		wctx, wcancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var stops []func(context.Context) error
		var aggMeters []string
		if o.aggregate {
			aggMeters = []string{meterDrillMeter}
		}
		for i, p := range procs[:2] {
			c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: rdb, DB: p.pool, Schema: schema, Stripe: sc,
				Stream: stream, Group: group, Name: fmt.Sprintf("m%d-%d", i, gen), Namespace: "drill", Count: 10, Workers: workers,
				Block: 50 * time.Millisecond, Lease: 5 * time.Second, Witness: p.mon, Logger: testenv.Logger(t), Clock: clk,
				SendFromLedger: o.fromLedger, AggregateMeters: aggMeters})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() { defer wg.Done(); _ = c.Run(wctx) }()
		}
		r, err := reaper.New(reaper.Config{Redis: rdb, DB: procs[2].pool, Schema: schema, Stripe: sc, MeterStripe: sc,
			Name: fmt.Sprintf("r-%d", gen), MeterStreams: []reaper.StreamGroup{{Stream: stream, Group: group}}, Namespace: "drill",
			MinIdle: 3 * time.Second, Interval: 500 * time.Millisecond, Lease: 5 * time.Second,
			Logger: testenv.Logger(t), Clock: clk, Witness: procs[2].mon})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(wctx); err != nil {
			t.Fatal(err)
		}
		stops = append(stops, r.Stop)
		stopWorkers = func() {
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer scancel()
			for _, s := range stops {
				_ = s(sctx)
			}
			wcancel()
			wg.Wait()
		}
	}
	startWorkers(0)
	t.Cleanup(func() { stopWorkers() })

	var all []meterDrillEvent
	stamp := clk.Now // the producers' clock
	newEvents := func(phase string, n int) []meterDrillEvent {
		var out []meterDrillEvent
		for i := range n {
			k := len(all) + len(out)
			out = append(out, meterDrillEvent{phase: phase, MeterEvent: event.MeterEvent{EventName: meterDrillMeter,
				CustomerID: fmt.Sprintf("c_%d", k%meterDrillCustomers), StripeCustomerID: fmt.Sprintf("cus_%d", k%meterDrillCustomers),
				Value: int64(1 + k%7), Timestamp: stamp().Add(-time.Duration(i) * time.Millisecond), EventID: fmt.Sprintf("%s-%d", phase, k)}})
		}
		all = append(all, out...)
		return out
	}
	xadd := func(p redis.Cmdable, evs []meterDrillEvent) {
		t.Helper()
		for _, e := range evs {
			if err := p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	recorded := func() int64 { return sim.MeterEventCounts().Recorded }
	drained := func() bool {
		p, err := rdb.XPending(ctx, stream, group).Result()
		if err != nil {
			return false
		}
		info, err := rdb.XInfoGroups(ctx, stream).Result()
		return err == nil && p.Count == 0 && len(info) == 1 && info[0].Lag == 0
	}
	sentAll := func(what string) {
		t.Helper()
		delivered := func() int {
			var n int
			_ = procs[0].pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.meter_events WHERE status = 'delivered'`).Scan(&n)
			return n
		}
		testenv.Eventually(t, 90*time.Second, func() bool {
			if o.aggregate {
				return delivered() == len(all) && drained()
			}
			return recorded() == int64(len(all)) && drained()
		}, "%s: %s", what, lazy(func() string {
			// Read when the wait ends, not when it begins.
			return fmt.Sprintf("%d calls recorded at the emulator, %d rows delivered, for %d events; drained %v",
				recorded(), delivered(), len(all), drained())
		}))
	}

	// Before: sent and replicated.
	xadd(rdb, newEvents("before", meterBefore))
	sentAll("before the stall")
	if err := cl.WaitReplicaCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	// The stall: sent, acked, witnessed, never replicated.
	if err := cl.StallReplication(ctx); err != nil {
		t.Fatal(err)
	}
	held.arm()
	xadd(rdb, newEvents("stall-a", meterStallA))
	if o.inFlight > 0 {
		all = holdInFlight(t, ctx, procs[0].pool, rdb, schema, meterwitness.Key(stream, group), held, all, clk.Now(),
			func(evs []meterDrillEvent) { xadd(rdb, evs) }, drained)
	} else {
		sentAll("the first half of the stall")
	}
	var dumps map[string]string
	var atRollback *redis.ZSliceCmd
	stallB := newEvents("stall-b", meterStallB)
	if o.redisRollsBack {
		// Redis's state at this instant comes back at the failover: the
		// second half's entries added, unread, their acks and witnesses
		// never written.
		mirror := witnessKey(t, ctx, procs[0].pool, schema)
		var mid string
		if err := procs[0].pool.QueryRow(ctx, `SELECT ledger_id FROM `+schema+`.ledger_fence`).Scan(&mid); err != nil {
			t.Fatal(err)
		}
		dumps = dumpKeys(t, ctx, rdb, func(pipe redis.Pipeliner) {
			xadd(pipe, stallB)
			atRollback = pipe.ZRangeWithScores(ctx, meterwitness.Key(stream, group), 0, -1)
		}, stream, mirror, meterwitness.Key(stream, group), meterwitness.RegistryKey(mid))
		held.free() // the held aggregates reach Stripe after the rollback point
	} else {
		xadd(rdb, stallB)
	}
	sentAll("the second half of the stall")
	var aggBefore map[string]string
	if o.dayOutage {
		stopWorkers()
		if o.inFlight > 0 {
			aggBefore = aggregatesOf(t, ctx, procs[0].pool, schema)
		}
	}

	loss, err := cl.FailoverLosingCommits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o.redisRollsBack {
		restoreKeys(t, ctx, rdb, dumps)
	}
	lost := map[string]int{}
	{
		conn, err := pgxpool.New(ctx, cl.Primary().URL())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		rows, err := conn.Query(ctx, `SELECT identifier FROM pelguard.meter_events WHERE status = 'delivered'`)
		if err == nil {
			for rows.Next() {
				var id string
				_ = rows.Scan(&id)
				ids = append(ids, id)
			}
			rows.Close()
		}
		conn.Close()
		have := map[string]bool{}
		for _, id := range ids {
			have[id] = true
		}
		for _, e := range all {
			if !have[e.Identifier("drill")] {
				lost[e.phase]++
			}
		}
	}
	t.Logf("failover: the replica was %d bytes behind; delivered rows gone from the ledger by phase: %v", loss.Bytes(), lost)
	if lost["stall-a"] == 0 || lost["stall-b"] == 0 || lost["before"] != 0 {
		t.Fatalf("the failover lost %v delivered rows: want rows of both halves of the stall and none from before", lost)
	}
	if !o.dayOutage {
		close(gate)
	}

	if o.dayOutage {
		testenv.Eventually(t, 30*time.Second, func() bool { return procs[0].mon.Suspect() && procs[1].mon.Suspect() && procs[2].mon.Suspect() },
			"the rollback was not detected")
		clk.Advance(25 * time.Hour)
		sim.Advance(25 * time.Hour)
		if o.aggregate {
			// An aggregate is formed once the group's ingest watermark has
			// passed its second, and the watermark is Redis's clock, which
			// the test cannot move a day: events stamped on the fleet's
			// clock would wait a day. The producers stamp the events after
			// the outage on Redis's clock instead (to the fleet they are a
			// day old; Stripe takes 35 days), and once the rollback is
			// repaired: a day-old entry not acked is one the repair parks,
			// as it cannot tell it from an entry the rollback lost.
			stamp = time.Now
		}
		close(gate)
		startWorkers(1)
		if o.aggregate {
			testenv.Eventually(t, 60*time.Second, func() bool {
				return !procs[0].mon.Suspect() && !procs[1].mon.Suspect() && !procs[2].mon.Suspect()
			}, "the rollback was not repaired")
		}
	}

	// Send on through it, with no command run by hand.
	xadd(rdb, newEvents("after", meterAfter))
	total := len(all)
	wantStripe := map[string]int64{}
	for _, e := range all {
		wantStripe[e.StripeCustomerID] += e.Value
	}
	counted := func() bool {
		if !o.aggregate {
			return recorded() >= int64(total)
		}
		for cus, v := range wantStripe {
			if sim.MeterTotal(meterDrillMeter, cus) < v {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, 90*time.Second, func() bool {
		return !procs[0].mon.Suspect() && !procs[1].mon.Suspect() && !procs[2].mon.Suspect() && drained() && counted()
	}, "usage did not resume with the rollback repaired: %s", lazy(func() string {
		var rows, aggs string
		_ = procs[0].pool.QueryRow(ctx, `SELECT coalesce(string_agg(s, ', '), '') FROM (SELECT status || ' ' || count(*) AS s
			FROM `+schema+`.meter_events GROUP BY status) x`).Scan(&rows)
		_ = procs[0].pool.QueryRow(ctx, `SELECT coalesce(string_agg(s, ', '), '') FROM (SELECT status || ' ' || count(*) AS s
			FROM `+schema+`.meter_aggregates GROUP BY status) x`).Scan(&aggs)
		short := map[string]int64{}
		for cus, v := range wantStripe {
			if d := v - sim.MeterTotal(meterDrillMeter, cus); d != 0 {
				short[cus] = d
			}
		}
		return fmt.Sprintf("%d calls recorded for %d events, customers short at Stripe by %v, drained %v, suspect %v/%v/%v, "+
			"events %s, aggregates %s", recorded(), total, short, drained(),
			procs[0].mon.Suspect(), procs[1].mon.Suspect(), procs[2].mon.Suspect(), rows, aggs)
	}))
	if o.fromLedger {
		// Drained is the entries; the ledger's queued rows go out after.
		testenv.Eventually(t, 60*time.Second, func() bool {
			var n int
			_ = procs[0].pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.meter_events WHERE status IN ('queued', 'sending')`).Scan(&n)
			return n == 0 && counted()
		}, "the ledger's unsent events were not all sent")
	}

	// Every event counted exactly once at the emulator (aggregated: each
	// customer's total, in no more calls than events).
	if o.aggregate {
		if got := recorded(); got > int64(total) {
			t.Fatalf("the emulator recorded %d calls for %d events", got, total)
		}
		checkSentOnce(t, sim, all)
	} else {
		byIdent := map[string]int{}
		for _, e := range sim.MeterEvents(meterDrillMeter, "") {
			byIdent[e.Identifier]++
		}
		for _, e := range all {
			if n := byIdent[e.Identifier("drill")]; n != 1 {
				t.Errorf("%s event %s counted %d times at the emulator", e.phase, e.EventID, n)
			}
		}
		if got := recorded(); got != int64(total) {
			t.Fatalf("the emulator recorded %d events for %d", got, total)
		}
	}

	// The ledger: per customer, delivered (and, after the outage, parked)
	// equal to Stripe's count, and meter_usage what the rows say.
	type sums struct{ delivered, parked, usage int64 }
	got := map[string]*sums{}
	for cus := range wantStripe {
		got[cus] = &sums{}
	}
	rows, err := procs[0].pool.Query(ctx, `SELECT stripe_customer_id, status, sum(value)::bigint FROM `+schema+`.meter_events GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var cus, st string
		var v int64
		if err := rows.Scan(&cus, &st, &v); err != nil {
			t.Fatal(err)
		}
		switch st {
		case "delivered":
			got[cus].delivered = v
		case "parked":
			got[cus].parked = v
		default:
			t.Errorf("%s: %d units of rows %s after the repair", cus, v, st)
		}
	}
	rows.Close()
	rows, err = procs[0].pool.Query(ctx, `SELECT stripe_customer_id, sum(units)::bigint FROM `+schema+`.meter_usage GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var cus string
		var v int64
		if err := rows.Scan(&cus, &v); err != nil {
			t.Fatal(err)
		}
		got[cus].usage = v
	}
	rows.Close()
	short := 0
	for cus, want := range wantStripe {
		g := got[cus]
		stripeTotal := sim.MeterTotal(meterDrillMeter, cus)
		if stripeTotal != want {
			t.Errorf("%s: Stripe counts %d, the events add up to %d", cus, stripeTotal, want)
		}
		if !o.dayOutage && g.delivered != stripeTotal || o.dayOutage && g.delivered+g.parked != stripeTotal {
			short++
			t.Errorf("%s: the ledger has %d delivered and %d parked, Stripe counts %d", cus, g.delivered, g.parked, stripeTotal)
		}
		if g.usage != g.delivered+g.parked {
			t.Errorf("%s: meter_usage holds %d units, the rows %d", cus, g.usage, g.delivered+g.parked)
		}
	}
	if short > 0 {
		t.Fatalf("%d of %d customers' ledgers differ from Stripe after the repair", short, len(wantStripe))
	}

	// What the repair did, and said.
	var rebuilt, findings int
	var report string
	if err := procs[0].pool.QueryRow(ctx, `SELECT coalesce(sum(rows_rebuilt), 0)::int, coalesce(sum(findings), 0)::int,
		coalesce(string_agg(report, ' | '), '') FROM `+schema+`.ledger_rollbacks`).Scan(&rebuilt, &findings, &report); err != nil {
		t.Fatal(err)
	}
	t.Logf("the repair rebuilt %d rows with %d findings: %s", rebuilt, findings, report)
	if rebuilt < lost["stall-a"] {
		t.Errorf("the repair restored %d rows; %d of the first half's delivered rows were lost and witnessed", rebuilt, lost["stall-a"])
	}
	var parked int
	if err := procs[0].pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.meter_events WHERE status = 'parked'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	switch {
	case o.dayOutage && o.inFlight > 0:
		checkAggregatesAfterADay(t, ctx, dayOutageAggregates{pool: procs[0].pool, rdb: rdb, sim: sim, schema: schema, stream: stream,
			all: all, atRollback: witnessSnapshot(t, atRollback.Val()), before: aggBefore, repairParked: lost["stall-b"],
			report: report, findings: findings, held: held.customers()})
	case o.dayOutage:
		if parked != lost["stall-b"] || findings < parked || !strings.Contains(report, "parked") {
			t.Fatalf("after a day's outage: %d events parked, %d findings; want the %d lost unacked events parked and named in the report",
				parked, findings, lost["stall-b"])
		}
		// Each dead-lettered with the repair's reason by whoever read its
		// entry (a consumer, or the reaper's re-drive), so that it can be
		// settled and replayed.
		dls, err := rdb.XRange(ctx, consumer.DeadLetterStream(stream), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		entries := map[any]bool{}
		for _, m := range dls {
			if d, _ := m.Values["detail"].(string); m.Values["reason"] == consumer.ReasonMeterParked && strings.Contains(d, "not acked") {
				entries[m.Values["source_id"]] = true
			}
		}
		if len(entries) != parked {
			t.Fatalf("%d entries dead-lettered with the repair's reason; want the %d events it parked", len(entries), parked)
		}
	case parked != 0:
		t.Fatalf("%d events parked; want none (within Stripe's window every event is restored or re-sent)", parked)
	}
	// More evidence after the repair (another process's memory) re-opens
	// the rollback and the repair runs again; that close is announced only
	// if its pass changed something: at most one alert per close.
	var closes int
	if err := procs[0].pool.QueryRow(ctx, `SELECT coalesce(sum(repairs), 0)::int FROM `+schema+`.ledger_rollbacks`).Scan(&closes); err != nil {
		t.Fatal(err)
	}
	if got := kinds(notes.Alerts()); got[alerts.KindLedgerRollback] != 1 || got[alerts.KindLedgerRepaired] < 1 || got[alerts.KindLedgerRepaired] > closes {
		t.Fatalf("alerts %v after %d repairs: want the rollback announced once and its repair at least once, at most once per repair", got, closes)
	}
}
