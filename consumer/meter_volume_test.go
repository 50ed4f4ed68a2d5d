package consumer_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Usage at volume, sent from the ledger with per-second aggregates of the
// sum meter (SendFromLedger, AggregateMeters): a busy customer at 200
// events/s for 30 s beside 50 quiet customers at 1 event/s each, Stripe
// answering each meter event in 100 ms, two consumers. Plain, and with
// consumers SIGKILLed and replaced, the group rolled back to 0, or the
// producer re-publishing what it sent (meter_volume_chaos_test.go). Each
// time every event is counted exactly once and the stream drained within
// 120 s of the last event, and the Stripe calls are accounted for
// (volumeCalls). -short: 10 s of load.
//
// The scenarios run volumeAtOnce at a time, each in its own world (stream,
// group, schema and emulator: setup): TestVolumeFromTheLedger runs them as
// subtests from goroutines, so they hold one of go test's -parallel slots
// between them and the package's other tests keep the other.

const (
	volumeBusyPerTick = 20 // per 100 ms: 200 events/s
	volumeQuiet       = 50 // customers at 1 event/s each (5 a tick)
	volumeLatency     = 100 * time.Millisecond
	// volumeDrainBound is how long after the last event every event must be
	// counted and the stream drained.
	volumeDrainBound = 120 * time.Second
	// volumeAtOnce is how many scenarios run at once: all four, in about
	// 125 s on 2 cores under -race (the sender lists a bounded window of
	// the backlog and reads only the partitions it needs; before it did,
	// four at once each sent 4-5 aggregates/s of the 52/s the load needs).
	// The CPU is what they share: lower it on a smaller machine.
	volumeAtOnce = 4
)

// volumeSeconds is how long the load runs: 30 s, 10 s with -short.
func volumeSeconds() int {
	if testing.Short() {
		return 10
	}
	return 30
}

// TestVolumeFromTheLedger runs the volume scenarios at once (see above).
func TestVolumeFromTheLedger(t *testing.T) {
	t.Parallel()
	scenarios := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"BusyCustomer", volumeBusyCustomer},
		{"UnderSIGKILLs", volumeUnderSIGKILLs},
		{"WithTheGroupRolledBack", volumeWithTheGroupRolledBack},
		{"WithEventsRepublished", volumeWithEventsRepublished},
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, volumeAtOnce)
	for _, s := range scenarios {
		wg.Add(1)
		// Not t.Parallel in the subtest: that would wait for -parallel
		// slots. t.Run may be called from several goroutines at once.
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			t.Run(s.name, s.run)
		}()
	}
	wg.Wait()
}

// The plain one: the load the stream once stalled under when it sent per
// event from the pending entries. Every Stripe call beyond one per
// aggregate is a refusal or a re-send the emulator and the ledger count.
func volumeBusyCustomer(t *testing.T) {
	b := volumeWorld(t, nil)
	b.runLedgerConsumers(t, 30*time.Second, "v-a", "v-b")
	all := b.produceVolume(t, nil)
	c := b.assertVolumeExact(t, all)
	// Nothing was killed: each attempt of an aggregate is one call, and a
	// second attempt follows only a call that was refused or not answered.
	if c.counts.Concurrent != 0 || c.counts.RateLimited != 0 || c.posts != int64(c.aggs+c.retries) {
		t.Errorf("no chaos, no limits: want no 429 and one call per attempt of an aggregate; %s", c)
	}
}

// volumeWorld is setup's world with the sum meter, Stripe answering each
// meter event in volumeLatency and onMeterCall (if any) called on every
// meter event call while it is in flight at the emulator.
func volumeWorld(t *testing.T, onMeterCall func(customer, eventName string)) *bundle {
	t.Helper()
	b := setup(t, opts{simNow: time.Now().UTC(), onMeterCall: onMeterCall})
	if _, err := b.sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: meterName}); err != nil {
		t.Fatal(err)
	}
	if err := b.sim.SetFaults(stripesim.Faults{MeterEventLatency: volumeLatency}); err != nil {
		t.Fatal(err)
	}
	return b
}

// volumeTick is the events of tick k (100 ms): the busy customer's (cus_0,
// a millisecond apart) and the quiet customers' whose turn it is (each
// once a second).
func volumeTick(k int, at time.Time) []event.MeterEvent {
	var evs []event.MeterEvent
	for i := range volumeBusyPerTick {
		evs = append(evs, meterEvent(0, k*volumeBusyPerTick+i, at.Add(time.Duration(i)*time.Millisecond)))
	}
	for q := 1; q <= volumeQuiet; q++ {
		if q%10 == k%10 {
			evs = append(evs, meterEvent(q, k/10, at))
		}
	}
	return evs
}

// publish adds evs to the stream in one pipeline (the producer).
func (b *bundle) publish(t *testing.T, evs []event.MeterEvent) {
	t.Helper()
	if len(evs) == 0 {
		return
	}
	_, err := b.rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
		for _, e := range evs {
			p.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: map[string]any{"payload": e.Payload()}})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// produceVolume publishes volumeSeconds of load, a tick every 100 ms,
// calling chaos (if any) after each tick with the tick's number and what
// was produced so far. It returns the events produced (each once).
func (b *bundle) produceVolume(t *testing.T, chaos func(k int, sofar []event.MeterEvent)) []event.MeterEvent {
	t.Helper()
	var all []event.MeterEvent
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for k := range volumeSeconds() * 10 {
		<-tick.C
		evs := volumeTick(k, time.Now().UTC())
		b.publish(t, evs)
		all = append(all, evs...)
		if chaos != nil {
			chaos(k, all)
		}
	}
	return all
}

// drained reports whether the group has nothing pending and nothing
// unread (lag 0: it has read up to the stream's last entry).
func (b *bundle) drained(t *testing.T) bool {
	t.Helper()
	gs, err := b.rdb.XInfoGroups(context.Background(), b.stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Name == b.group {
			return g.Lag == 0 && g.Pending == 0
		}
	}
	t.Fatalf("group %s not found", b.group)
	return false
}

// runLedgerConsumers runs consumers named names, sending from the ledger
// with the sum meter aggregated, until the test ends.
func (b *bundle) runLedgerConsumers(t *testing.T, lease time.Duration, names ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range names {
		c := b.aggConsumer(t, name, lease)
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// volumeCalls accounts for the Stripe calls of a volume run: each
// aggregate is recorded once, so the calls are at most one per distinct
// (customer, meter, second) of the events, plus the aggregates of such a
// second formed in another arrival bucket (its entries added after the
// second ended: meterledger.FormAggregate), plus late joins, plus
// re-sends after an unknown outcome (a refusal, a lost reply, a takeover
// after a kill), which the emulator counts by kind.
type volumeCalls struct {
	tuples  int   // distinct (customer, meter, second) of the events produced
	splits  int   // aggregates of such a second in a further arrival bucket
	late    int   // late joins: further aggregates of one (customer, meter, second, bucket)
	aggs    int   // aggregates in the ledger (tuples + splits + late)
	retries int   // the aggregates' attempts beyond their first (takeovers)
	posts   int64 // POST /v1/billing/meter_events that reached the emulator
	counts  stripesim.MeterEventCounts
	// replays: posts the emulator answered without counting them by kind
	// (an Idempotency-Key replayed, or 409 while its first use runs).
	replays int64
}

func (c volumeCalls) String() string {
	return fmt.Sprintf("%d calls (%d recorded, refused: %d duplicates, %d concurrent, %d rate-limited, %d invalid; "+
		"%d rejected, %d idempotent replays) for %d (customer, meter, second) tuples + %d arrival-bucket splits + %d late joins "+
		"= %d aggregates, + %d re-sends", c.posts, c.counts.Recorded, c.counts.Duplicates, c.counts.Concurrent,
		c.counts.RateLimited, c.counts.Invalid, c.counts.Rejected, c.replays, c.tuples, c.splits, c.late, c.aggs, c.retries)
}

// ledgerAggregate is a row of meter_aggregates with its members' sum.
type ledgerAggregate struct {
	customer, meter, status string
	second, bucket          int64
	value, memberSum        int64
	members, memberRows     int
	attempts                int
}

func (b *bundle) ledgerAggregates(t *testing.T) map[string]ledgerAggregate {
	t.Helper()
	schema := testenv.SchemaOf(b.pool)
	rows, err := b.pool.Query(context.Background(), `SELECT a.identifier, a.stripe_customer_id, a.event_name, a.status,
			extract(epoch FROM a.second)::bigint, coalesce(a.arrival_second, 0), a.value, a.members, a.attempts,
			coalesce(m.n, 0), coalesce(m.total, 0)
		FROM `+schema+`.meter_aggregates a
		LEFT JOIN (SELECT aggregate, count(*) AS n, sum(value)::bigint AS total FROM `+schema+`.meter_events
			WHERE aggregate IS NOT NULL GROUP BY aggregate) m ON m.aggregate = a.identifier
		WHERE a.stream = $1`, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]ledgerAggregate{}
	for rows.Next() {
		var id string
		var a ledgerAggregate
		if err := rows.Scan(&id, &a.customer, &a.meter, &a.status, &a.second, &a.bucket, &a.value, &a.members, &a.attempts,
			&a.memberRows, &a.memberSum); err != nil {
			t.Fatal(err)
		}
		out[id] = a
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// volumeState is what the end of a run waits for.
func (b *bundle) volumeState(t *testing.T, want map[string]int64, n int64) (done bool, why string) {
	t.Helper()
	var short []string
	for cus, v := range want {
		if got := b.sim.MeterTotal(meterName, cus); got != v {
			short = append(short, fmt.Sprintf("%s %d of %d", cus, got, v))
		}
	}
	sort.Strings(short)
	var delivered, sending int64
	schema := testenv.SchemaOf(b.pool)
	if err := b.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+schema+`.meter_events WHERE status = 'delivered'),
		(SELECT count(*) FROM `+schema+`.meter_aggregates WHERE status = 'sending')`).Scan(&delivered, &sending); err != nil {
		t.Fatal(err)
	}
	drained := b.drained(t)
	nshort := len(short)
	if nshort > 8 {
		short = append(short[:8], fmt.Sprintf("and %d more", nshort-8))
	}
	return nshort == 0 && delivered == n && sending == 0 && drained, fmt.Sprintf(
		"customers short at Stripe: %d [%s]; ledger: %d of %d delivered, %d aggregates sending; stream drained: %v (%d pending); emulator %+v",
		nshort, strings.Join(short, ", "), delivered, n, sending, drained, b.pending(t), b.sim.MeterEventCounts())
}

// assertVolumeExact waits (volumeDrainBound) until every customer's total
// at Stripe is what it produced, the ledger has every event delivered and
// no aggregate sending, and the stream is drained; then checks each event
// was counted exactly once and accounts for the Stripe calls.
func (b *bundle) assertVolumeExact(t *testing.T, all []event.MeterEvent) volumeCalls {
	t.Helper()
	last := time.Now()
	want := sums(all)
	ids := map[string]bool{}
	tuples := map[string]bool{}
	for _, e := range all {
		ids[e.Identifier("test")] = true
		tuples[fmt.Sprintf("%s/%s/%d", e.StripeCustomerID, e.EventName, e.Timestamp.Unix())] = true
	}
	n := int64(len(ids))
	if n != int64(len(all)) {
		t.Fatalf("the load has %d distinct identifiers for %d events", n, len(all))
	}
	for {
		done, why := b.volumeState(t, want, n)
		if done {
			break
		}
		if time.Since(last) > volumeDrainBound {
			t.Fatalf("not counted and drained within %s of the last event: %s", volumeDrainBound, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(last)
	time.Sleep(500 * time.Millisecond) // nothing more may come
	if done, why := b.volumeState(t, want, n); !done {
		t.Fatalf("drained, then no longer: %s", why)
	}

	// Per customer: Stripe's total and the ledger's delivered total are
	// what the customer produced.
	b.assertMeterTotals(t, want)
	now := time.Now()
	got, err := b.meterLedger(t).DeliveredTotals(context.Background(), meterName, now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		if g.Value != want[g.StripeCustomerID] {
			t.Errorf("%s: the ledger's delivered total is %d, the events add up to %d", g.StripeCustomerID, g.Value, want[g.StripeCustomerID])
		}
	}
	if len(got) != len(want) {
		t.Errorf("the ledger has delivered totals of %d customers, want %d", len(got), len(want))
	}
	var rows, inAgg int64
	schema := testenv.SchemaOf(b.pool)
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), count(aggregate) FROM `+schema+`.meter_events`).Scan(&rows, &inAgg); err != nil {
		t.Fatal(err)
	}
	if counts := b.ledgerCounts(t); counts[meterledger.StatusDelivered] != n || len(counts) != 1 || rows != n || inAgg != n {
		t.Errorf("ledger %v, %d rows, %d of them in an aggregate: want %d delivered, each in an aggregate, and nothing else", counts, rows, inAgg, n)
	}
	if d := b.deadLetters(t); d != 0 {
		t.Errorf("%d dead letters, want none", d)
	}

	// Each aggregate is delivered with its members, recorded once at the
	// emulator with their sum, and nothing else is recorded.
	aggs := b.ledgerAggregates(t)
	recorded := map[string]int{}
	for _, r := range b.sim.MeterEvents("", "") {
		if r.Cancelled {
			t.Errorf("%s was cancelled at the emulator", r.Identifier)
			continue
		}
		recorded[r.Identifier]++
		a, ok := aggs[r.Identifier]
		switch {
		case !ok:
			t.Errorf("the emulator counted %s (%s, %s, %d), which is no aggregate of the ledger", r.Identifier, r.EventName, r.Customer, r.Value)
		case r.Customer != a.customer || r.EventName != a.meter || r.Value != a.value || r.Timestamp.Unix() != a.second:
			t.Errorf("%s counted as %s/%s/%d at %d, formed as %s/%s/%d at %d", r.Identifier, r.Customer, r.EventName, r.Value,
				r.Timestamp.Unix(), a.customer, a.meter, a.value, a.second)
		}
	}
	type bucket struct {
		tuple string
		b     int64
	}
	buckets := map[bucket]int{}
	formed := map[string]bool{}
	var c volumeCalls
	for id, a := range aggs {
		if recorded[id] != 1 || a.status != string(meterledger.StatusDelivered) || a.memberRows != a.members || a.memberSum != a.value {
			t.Errorf("aggregate %s (%s at %d): %s, %d members of sum %d (%d rows of sum %d), recorded %d times at the emulator; "+
				"want delivered with its members, recorded once", id, a.customer, a.second, a.status, a.members, a.value,
				a.memberRows, a.memberSum, recorded[id])
		}
		tuple := fmt.Sprintf("%s/%s/%d", a.customer, a.meter, a.second)
		if !tuples[tuple] {
			t.Errorf("aggregate %s of %s: no event was produced for that customer, meter and second", id, tuple)
		}
		formed[tuple] = true
		buckets[bucket{tuple, a.bucket}]++
		c.retries += a.attempts - 1
	}
	if len(formed) != len(tuples) {
		t.Errorf("aggregates of %d (customer, meter, second) tuples, %d produced", len(formed), len(tuples))
	}
	c.tuples, c.aggs = len(tuples), len(aggs)
	c.splits = len(buckets) - len(formed)
	c.late = len(aggs) - len(buckets)
	c.counts = b.sim.MeterEventCounts()
	c.posts = b.sim.Requests()["POST /v1/billing/meter_events"]
	k := c.counts
	c.replays = c.posts - (k.Recorded + k.Duplicates + k.Concurrent + k.RateLimited + k.Invalid + k.Rejected)
	t.Logf("%d events of %d customers over %d s: counted and drained %s after the last; %s",
		n, len(want), volumeSeconds(), took.Round(time.Millisecond), c)
	// What is allowed: one call per aggregate, each recorded once; every
	// further call a re-send of an aggregate (refused as a duplicate or
	// for its customer-meter's call in flight, or replayed), none invalid
	// or dropped.
	if k.Recorded != int64(c.aggs) || k.Invalid != 0 || k.Rejected != 0 || c.replays < 0 ||
		c.posts > int64(c.tuples+c.splits+c.late+c.retries) {
		t.Errorf("want calls ≤ tuples + splits + late joins + re-sends, one recorded per aggregate, none invalid or rejected: %s", c)
	}
	return c
}

// ledgerCounts is the ledger's meter events by status.
func (b *bundle) ledgerCounts(t *testing.T) map[meterledger.Status]int64 {
	t.Helper()
	now := time.Now()
	counts, err := b.meterLedger(t).Counts(context.Background(), now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return counts
}
