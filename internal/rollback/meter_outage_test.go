package rollback_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// And with a day's outage: Redis rolled back too, to an instant when two
// customers' aggregates were in flight at Stripe (witnessed with their
// members before the call, recorded by Stripe after the instant). After
// 25 h on the emulator's clock and the fleet's, past Stripe's identifier
// window: those aggregates come back from the witness of unknown outcome
// and are parked with their members (each member dead-lettered with the
// reason), events witnessed only at ingest are parked on their own, the
// second half's unread entries are parked by the repair, named in its
// report and dead-lettered with its reason — and nothing is sent again: each aggregate identifier recorded
// at most once, no member on its own.
func TestUsageThroughAFailoverWithAggregatesAndADayOutage(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true, dayOutage: true, fromLedger: true, aggregate: true, inFlight: 2})
}

// Within Stripe's window, with the same aggregates in flight at Redis's
// rollback point: they come back from the witness and are re-sent under
// their identifiers (refused as duplicates: delivered); the events
// witnessed only at ingest, sent since in aggregates both stores lost,
// are never sent on their own: each customer counted once.
func TestUsageThroughAFailoverWithAggregatesInFlightAndRedisRolledBack(t *testing.T) {
	t.Parallel()
	meterDrill(t, meterDrillOpts{redisRollsBack: true, fromLedger: true, aggregate: true, inFlight: 2})
}

// checkSentOnce asserts that the emulator recorded each identifier at most
// once and no drill event on its own (aggregated: its aggregate carries
// it), and returns the recorded identifiers.
func checkSentOnce(t *testing.T, sim *stripesim.Server, all []meterDrillEvent) map[string]int {
	t.Helper()
	byIdent := map[string]meterDrillEvent{}
	for _, e := range all {
		byIdent[e.Identifier("drill")] = e
	}
	recorded := map[string]int{}
	for _, e := range sim.MeterEvents(meterDrillMeter, "") {
		recorded[e.Identifier]++
	}
	for id, n := range recorded {
		if n > 1 {
			t.Errorf("identifier %s recorded %d times at the emulator", id, n)
		}
		if e, ok := byIdent[id]; ok {
			t.Errorf("%s event %s recorded on its own at the emulator: an aggregate carries it", e.phase, e.EventID)
		}
	}
	return recorded
}

// heldCalls holds, once armed, the first meter event call of each of the
// first n drill customers inside the emulator (its customer-and-meter slot
// taken, not yet recorded) until release: an aggregate in flight.
type heldCalls struct {
	n       int
	mu      sync.Mutex
	armed   bool
	held    map[string]bool
	release chan struct{}
	once    sync.Once
}

func newHeldCalls(t *testing.T, n int) *heldCalls {
	h := &heldCalls{n: n, held: map[string]bool{}, release: make(chan struct{})}
	t.Cleanup(h.free)
	return h
}

// customers are the held customers' Stripe ids.
func (h *heldCalls) customers() map[string]bool {
	out := map[string]bool{}
	for i := range h.n {
		out[fmt.Sprintf("cus_%d", i)] = true
	}
	return out
}

// hook is the emulator's OnMeterEventInFlight.
func (h *heldCalls) hook(customer, _ string) {
	if h == nil || h.n == 0 {
		return
	}
	h.mu.Lock()
	hold := h.armed && !h.held[customer] && h.customers()[customer]
	if hold {
		h.held[customer] = true
	}
	h.mu.Unlock()
	if hold {
		<-h.release
	}
}

func (h *heldCalls) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

// all reports whether every held customer has a call held.
func (h *heldCalls) all() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held) == h.n
}

// free lets the held calls be recorded.
func (h *heldCalls) free() { h.once.Do(func() { close(h.release) }) }

// witnessed is a meter witness member as the test reads it.
type witnessed struct {
	Status     string   `json:"s"`
	Identifier string   `json:"i"`
	Members    []string `json:"g"`
}

// witnessSnapshot reads the meter witness members zs (one instant's).
func witnessSnapshot(t *testing.T, zs []redis.Z) []witnessed {
	t.Helper()
	var out []witnessed
	for _, z := range zs {
		m, _ := z.Member.(string)
		if strings.HasPrefix(m, "~") {
			continue // the pruned bound
		}
		var w witnessed
		if err := json.Unmarshal([]byte(m), &w); err != nil {
			t.Fatalf("meter witness member %q: %v", m, err)
		}
		out = append(out, w)
	}
	return out
}

// dayOutageAggregates is what checkAggregatesAfterADay reads.
type dayOutageAggregates struct {
	pool           *pgxpool.Pool
	rdb            *redis.Client
	sim            *stripesim.Server
	schema, stream string
	all            []meterDrillEvent
	// atRollback: the meter witness at Redis's rollback point; before:
	// each event's aggregate in the ledger just before the failover.
	atRollback []witnessed
	before     map[string]string
	// repairParked: events whose entries were unread at the rollback
	// point (the repair parks them); report, findings: the repair's.
	repairParked int
	report       string
	findings     int
	held         map[string]bool
}

// checkAggregatesAfterADay asserts, after a day's outage with aggregates:
// exactly the events not witnessed delivered at the rollback point are
// parked; every aggregate in flight then is parked with its witnessed
// members, each member dead-lettered with the reason; nothing was sent
// twice (an aggregate identifier recorded at most once, no member on its
// own); per customer, Stripe's total is the ledger's delivered units plus
// those of parked events whose aggregate Stripe recorded; and the repair's
// report names what it parked and each aggregate whose outcome it could
// not restore.
func checkAggregatesAfterADay(t *testing.T, ctx context.Context, d dayOutageAggregates) {
	t.Helper()
	q := func(sql string, args ...any) pgxRows {
		rows, err := d.pool.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	deliveredThen := map[string]bool{}
	inFlight := map[string][]string{} // aggregate → members, witnessed before the call, not delivered then
	for _, w := range d.atRollback {
		if w.Status == "delivered" {
			deliveredThen[w.Identifier] = true
		}
	}
	for _, w := range d.atRollback {
		if w.Status != "aggregate" {
			continue
		}
		for _, m := range w.Members {
			if !deliveredThen[m] {
				inFlight[w.Identifier] = w.Members
				break
			}
		}
	}
	if len(inFlight) < len(d.held) {
		t.Fatalf("%d aggregates in flight at the rollback point; want one per held customer (%d)", len(inFlight), len(d.held))
	}
	byIdent := map[string]meterDrillEvent{}
	wantParked := map[string]bool{}
	for _, e := range d.all {
		id := e.Identifier("drill")
		byIdent[id] = e
		if (e.phase == "stall-a" || e.phase == "stall-b") && !deliveredThen[id] {
			wantParked[id] = true
		}
	}

	// The ledger: exactly the events not witnessed delivered are parked.
	type row struct {
		status, aggregate, reason string
	}
	rows := map[string]row{}
	r := q(`SELECT identifier, status, coalesce(aggregate, ''), coalesce(last_error, '') FROM ` + d.schema + `.meter_events`)
	for r.Next() {
		var id string
		var x row
		if err := r.Scan(&id, &x.status, &x.aggregate, &x.reason); err != nil {
			t.Fatal(err)
		}
		rows[id] = x
	}
	r.Close()
	for id, e := range byIdent {
		x, ok := rows[id]
		switch {
		case !ok:
			t.Errorf("%s event %s has no row after the repair", e.phase, e.EventID)
		case wantParked[id] && x.status != "parked":
			t.Errorf("%s event %s (not witnessed delivered at the rollback point) is %s; want parked", e.phase, e.EventID, x.status)
		case !wantParked[id] && x.status != "delivered":
			t.Errorf("%s event %s (witnessed delivered, or sent after the repair) is %s; want delivered", e.phase, e.EventID, x.status)
		}
	}

	// Every aggregate in flight at the rollback point: back from the
	// witness, parked with exactly its witnessed members.
	for id, members := range inFlight {
		var st, reason string
		var unknown bool
		if err := d.pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), outcome_unknown FROM `+d.schema+`.meter_aggregates
			WHERE identifier = $1`, id).Scan(&st, &reason, &unknown); err != nil {
			t.Fatalf("aggregate %s, in flight at the rollback point: %v", id, err)
		}
		if st != "parked" || !unknown || reason == "" {
			t.Errorf("aggregate %s in flight at the rollback point is %s (outcome unknown %v, %q); want parked with its reason", id, st, unknown, reason)
		}
		got := []string{}
		for mid, x := range rows {
			if x.aggregate == id {
				got = append(got, mid)
				if x.status != "parked" {
					t.Errorf("member %s of parked aggregate %s is %s", mid, id, x.status)
				}
			}
		}
		want := append([]string(nil), members...)
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("aggregate %s: members %v in the ledger, %v witnessed", id, got, want)
		}
	}
	var sending int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+d.schema+`.meter_aggregates WHERE status = 'sending'`).Scan(&sending); err != nil {
		t.Fatal(err)
	}
	if sending != 0 {
		t.Errorf("%d aggregates still sending", sending)
	}

	// Each member of a parked aggregate, and each event parked on its own
	// by a sender, is dead-lettered with the reason; those the repair
	// parked (their entries unread) are named in its report and
	// dead-lettered with its reason by the consumer that read them.
	dls, err := d.rdb.XRange(ctx, consumer.DeadLetterStream(d.stream), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byPayload := map[string]string{}
	for id, e := range byIdent {
		byPayload[e.Payload()] = id
	}
	dead := map[string]string{}
	for _, m := range dls {
		id, _ := m.Values["identifier"].(string)
		if id == "" {
			p, _ := m.Values["payload"].(string)
			id = byPayload[p]
		}
		if m.Values["reason"] == consumer.ReasonMeterParked {
			detail, _ := m.Values["detail"].(string)
			dead[id] = detail
		}
	}
	repairParked := 0
	for id := range wantParked {
		x := rows[id]
		detail, ok := dead[id]
		switch {
		case x.aggregate != "" && inFlight[x.aggregate] != nil:
			if !ok || !strings.Contains(detail, x.aggregate) {
				t.Errorf("member %s of parked aggregate %s: dead letter %v %q; want one naming the aggregate", id, x.aggregate, ok, detail)
			}
		case strings.Contains(x.reason, "not acked"):
			repairParked++ // the repair's: its entry was unread
			if !ok || !strings.Contains(detail, "not acked") {
				t.Errorf("%s event %s parked by the repair: dead letter %v %q; want one giving the repair's reason",
					byIdent[id].phase, byIdent[id].EventID, ok, detail)
			}
		case !ok || detail == "":
			t.Errorf("%s event %s parked (%q) without a dead letter giving the reason", byIdent[id].phase, byIdent[id].EventID, x.reason)
		}
	}
	if repairParked != d.repairParked {
		t.Errorf("the repair parked %d events; want the %d whose entries Redis's rollback left unread", repairParked, d.repairParked)
	}
	if d.findings < d.repairParked || !strings.Contains(d.report, fmt.Sprintf("%d parked (not acked", d.repairParked)) {
		t.Errorf("the repair's report (%d findings) does not say it parked the %d events it could not restore: %s",
			d.findings, d.repairParked, d.report)
	}
	for id := range inFlight {
		if !strings.Contains(d.report, id) {
			t.Errorf("the repair's report does not name aggregate %s, of unknown outcome past the safe window: %s", id, d.report)
		}
	}

	// Nothing sent twice, and every aggregate in flight recorded.
	recorded := checkSentOnce(t, d.sim, d.all)
	for id := range inFlight {
		if recorded[id] != 1 {
			t.Errorf("aggregate %s, in flight at the rollback point, recorded %d times; want once (the held call)", id, recorded[id])
		}
	}

	// Per customer: Stripe = delivered + parked whose aggregate (in the
	// ledger now, or before the failover) Stripe recorded.
	type sums struct{ delivered, parkedCounted, parkedNot int64 }
	per := map[string]*sums{}
	for id, e := range byIdent {
		s := per[e.StripeCustomerID]
		if s == nil {
			s = &sums{}
			per[e.StripeCustomerID] = s
		}
		switch x := rows[id]; x.status {
		case "delivered":
			s.delivered += e.Value
		case "parked":
			if recorded[x.aggregate] > 0 || recorded[d.before[id]] > 0 {
				s.parkedCounted += e.Value
			} else {
				s.parkedNot += e.Value
			}
		}
	}
	for cus, s := range per {
		if got := d.sim.MeterTotal(meterDrillMeter, cus); got != s.delivered+s.parkedCounted || s.parkedNot != 0 {
			t.Errorf("%s: Stripe counts %d; the ledger has %d delivered, %d parked whose aggregate Stripe recorded, %d parked it did not",
				cus, got, s.delivered, s.parkedCounted, s.parkedNot)
		}
	}
}

// pgxRows is the part of pgx.Rows the checks use.
type pgxRows interface {
	Next() bool
	Scan(...any) error
	Close()
}

// holdInFlight waits until h holds its customers' first calls of the
// first half of the stall, adds one more event of each (stamped at, in a
// later arrival second: ingested and acked behind its customer's call in
// flight, its aggregate formed only after), and waits for the instant
// Redis's state is taken at (waitInFlight). It returns all with them.
func holdInFlight(t *testing.T, ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, schema, witnessKey string,
	h *heldCalls, all []meterDrillEvent, at time.Time, add func([]meterDrillEvent), drained func() bool) []meterDrillEvent {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, h.all, "the held customers' calls did not reach the emulator")
	// The arrival bucket is the second an entry is added (Redis's clock).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	var behind []meterDrillEvent
	for i := range h.n {
		k := len(all) + i
		behind = append(behind, meterDrillEvent{phase: "stall-a", MeterEvent: event.MeterEvent{EventName: meterDrillMeter,
			CustomerID: fmt.Sprintf("c_%d", i), StripeCustomerID: fmt.Sprintf("cus_%d", i), Value: int64(1 + k%7),
			Timestamp: at, EventID: fmt.Sprintf("stall-a-behind-%d", k)}})
	}
	all = append(all, behind...)
	add(behind)
	waitInFlight(t, ctx, pool, rdb, schema, witnessKey, h, all, drained)
	return all
}

// waitInFlight waits until every held customer's first aggregate of the
// first half of the stall is held at the emulator, every entry is acked,
// and every other customer's first half is delivered and witnessed: the
// instant Redis's state is taken at.
func waitInFlight(t *testing.T, ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, schema, witnessKey string,
	h *heldCalls, all []meterDrillEvent, drained func() bool) {
	t.Helper()
	heldCus := h.customers()
	var others []string
	for _, e := range all {
		if e.phase == "stall-a" && !heldCus[e.StripeCustomerID] {
			others = append(others, e.Identifier("drill"))
		}
	}
	state := func() string {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.meter_events WHERE status = 'delivered' AND identifier = ANY($1)`, others).Scan(&n)
		zs, _ := rdb.ZRangeWithScores(ctx, witnessKey, 0, -1).Result()
		witnessed := map[string]bool{}
		for _, w := range witnessSnapshot(t, zs) {
			if w.Status == "delivered" {
				witnessed[w.Identifier] = true
			}
		}
		w := 0
		for _, id := range others {
			if witnessed[id] {
				w++
			}
		}
		return fmt.Sprintf("held %v, drained %v, %d delivered and %d witnessed of the other customers' %d", h.all(), drained(), n, w, len(others))
	}
	want := fmt.Sprintf("held true, drained true, %d delivered and %d witnessed of the other customers' %d", len(others), len(others), len(others))
	var last string
	testenv.Eventually(t, 90*time.Second, func() bool {
		if last = state(); last != want {
			time.Sleep(100 * time.Millisecond) // two loaded cores: poll gently
		}
		return last == want
	}, "aggregates in flight: %s", lazy(func() string { return last }))
}

// lazy formats as its result when printed.
type lazy func() string

func (l lazy) String() string { return l() }

// aggregatesOf maps each event of the ledger to its aggregate.
func aggregatesOf(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) map[string]string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT identifier, aggregate FROM `+schema+`.meter_events WHERE aggregate IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, agg string
		if err := rows.Scan(&id, &agg); err != nil {
			t.Fatal(err)
		}
		out[id] = agg
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
