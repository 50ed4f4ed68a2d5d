package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/redissentinel"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/redisurl"
)

// The sets' passwords carry the marker, so every process's output is
// searched for them (assertNoSecret).
const (
	sentinelDataPassword = marker + "data@pw09"
	sentinelPassword     = marker + "sentinel#pw10"
)

func startSentinels(t *testing.T) *redissentinel.Set {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := redissentinel.Start(ctx, redissentinel.Options{Dir: t.TempDir(),
		Password: sentinelDataPassword, SentinelPassword: sentinelPassword})
	if errors.Is(err, redissentinel.ErrUnsupported) {
		t.Skipf("no Redis Sentinel here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// sentinelRun is one billing run through a Sentinel set: a producer
// XADDing at a steady rate through the sentinels, two consumers and the
// reaper (the real binaries, REDIS_URL=redis+sentinel://…), the emulator.
type sentinelRun struct {
	t      *testing.T
	set    *redissentinel.Set
	sim    *stripesim.Server
	rdb    redis.UniversalClient
	db     *pgxpool.Pool // the ledger, whose charged_at times the first charge
	schema string
	stream string
	procs  []*proc
	// meter: usage to Stripe Billing Meters (consumer meter-events, the
	// reaper's --meter-stream) instead of charges.
	meter bool

	mu    sync.Mutex
	added map[int]time.Time // event index → when its XADD succeeded
	next  atomic.Int64
	stopP chan struct{}
	doneP chan struct{}
}

const sentinelPeriod = "2026-11"

func sentinelCustomer(i int) string { return "c_s" + strconv.Itoa(i) }

// The meter runs give each event a Stripe customer of its own: its usage
// at the emulator is 1 exactly when the event was counted once.
func meterCustomer(i int) string { return "cus_m" + strconv.Itoa(i) }

const sentinelMeter = "api_requests"

func newSentinelRun(t *testing.T, set *redissentinel.Set, meter bool) *sentinelRun {
	t.Helper()
	ctx := context.Background()
	// A few milliseconds a call, so that calls are in flight when the
	// primary dies.
	sim := stripesim.MustNew(stripesim.Config{Faults: stripesim.Faults{Latency: stripesim.Latency{Fixed: 3 * time.Millisecond}}})
	t.Cleanup(sim.Close)
	rdb, err := redisurl.Open(set.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	r := &sentinelRun{t: t, set: set, sim: sim, rdb: rdb, stream: "billing-sentinel", added: map[int]time.Time{},
		stopP: make(chan struct{}), doneP: make(chan struct{}), meter: meter}
	if meter {
		r.stream = "usage-sentinel"
		if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: sentinelMeter}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XGroupCreateMkStream(ctx, r.stream, "billing-group", "0").Err(); err != nil {
		t.Fatal(err)
	}
	pool, dbURL := testenv.DBWithURL(t)
	r.db, r.schema = pool, testenv.SchemaOfURL(dbURL)
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+set.URL(), "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	var cmd, reap []string
	if meter {
		cmd, reap = []string{"meter-events", "--stream", r.stream}, []string{"--meter-stream", r.stream}
	} else {
		cmd, reap = []string{"run", "--stream", r.stream}, []string{"--stream", r.stream}
	}
	for i := range 2 {
		r.procs = append(r.procs, startBin(t, "consumer", env, append(cmd, "--metrics-addr", "127.0.0.1:0", "--block", "200ms",
			"--lease", "3s", "--name", "sentinel-c"+strconv.Itoa(i))...))
	}
	r.procs = append(r.procs, startBin(t, "reaper", env, append(reap, "--metrics-addr", "127.0.0.1:0", "--min-idle", "3s",
		"--interval", "500ms", "--lease", "3s")...))
	for _, p := range r.procs {
		p.addr()
	}
	return r
}

// produce XADDs event after event, one every gap, through the sentinels;
// a failed XADD is tried again (it may have reached the old primary too: a
// second entry for the event, which the ledger absorbs).
func (r *sentinelRun) produce(gap time.Duration) {
	go func() {
		defer close(r.doneP)
		ctx := context.Background()
		for {
			select {
			case <-r.stopP:
				return
			case <-time.After(gap):
			}
			i := int(r.next.Load())
			payload := event.Event{CustomerID: sentinelCustomer(i), StripeCustomerID: "cus_s" + strconv.Itoa(i), AmountCents: 100,
				BillingPeriod: sentinelPeriod, Currency: "usd"}.Payload()
			if r.meter {
				payload = event.MeterEvent{EventName: sentinelMeter, StripeCustomerID: meterCustomer(i), Value: 1,
					Timestamp: time.Now().UTC(), EventID: "m" + strconv.Itoa(i)}.Payload()
			}
			if err := r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.stream, Values: map[string]any{"payload": payload}}).Err(); err != nil {
				continue
			}
			r.mu.Lock()
			r.added[i] = time.Now()
			r.mu.Unlock()
			r.next.Add(1)
		}
	}()
}

func (r *sentinelRun) stopProducing() { close(r.stopP); <-r.doneP }

func (r *sentinelRun) charged() int {
	if r.meter {
		return int(r.sim.MeterEventCounts().Recorded)
	}
	n := 0
	for _, ch := range r.sim.Charges() {
		if ch.Status == "succeeded" {
			n++
		}
	}
	return n
}

// firstChargeAfter is the earliest charge of an event first added after t
// (so only ever in the new primary's stream), as seconds after t.
func (r *sentinelRun) firstChargeAfter(t time.Time) (float64, bool) {
	r.mu.Lock()
	var after, afterMeter []string
	for i, at := range r.added {
		if at.After(t) {
			after = append(after, sentinelCustomer(i))
			afterMeter = append(afterMeter, meterCustomer(i))
		}
	}
	r.mu.Unlock()
	first := time.Time{}
	if r.meter {
		for _, cus := range afterMeter {
			for _, e := range r.sim.MeterEvents(sentinelMeter, cus) {
				if first.IsZero() || e.Received.Before(first) {
					first = e.Received
				}
			}
		}
		return first.Sub(t).Seconds(), !first.IsZero()
	}
	// The ledger's charged_at, not the emulator's created (whole seconds,
	// as Stripe's): recorded right after Stripe's answer.
	var at *time.Time
	if err := r.db.QueryRow(context.Background(), `SELECT min(charged_at) FROM `+pgx.Identifier{r.schema, "billing_records"}.Sanitize()+
		` WHERE status = 'charged' AND customer_id = ANY($1)`, after).Scan(&at); err != nil {
		r.t.Fatal(err)
	}
	if at != nil {
		first = *at
	}
	return first.Sub(t).Seconds(), !first.IsZero()
}

// settle waits until every event in the (new) primary's stream has a
// charge and the PEL is empty, then checks: exactly one succeeded charge
// for each, no duplicate at the emulator, every process still running,
// and no password printed.
func (r *sentinelRun) settle(within time.Duration) {
	t := r.t
	ctx := context.Background()
	var inStream map[string]bool
	testenv.Eventually(t, within, func() bool {
		entries, err := r.rdb.XRange(ctx, r.stream, "-", "+").Result()
		if err != nil {
			return false
		}
		inStream = map[string]bool{}
		for _, e := range entries {
			var ev struct {
				CustomerID       string `json:"customer_id"`
				StripeCustomerID string `json:"stripe_customer_id"`
			}
			if err := json.Unmarshal([]byte(e.Values["payload"].(string)), &ev); err != nil {
				t.Fatalf("entry %s: %v", e.ID, err)
			}
			if r.meter {
				inStream[ev.StripeCustomerID] = true
			} else {
				inStream[ev.CustomerID] = true
			}
		}
		perKey := r.perKey()
		for c := range inStream {
			if perKey[c] == 0 {
				return false
			}
		}
		pend, err := r.rdb.XPending(ctx, r.stream, "billing-group").Result()
		return err == nil && pend.Count == 0
	}, "every event of the promoted primary's stream charged and the PEL drained")
	perKey := r.perKey()
	for c := range inStream {
		if perKey[c] != 1 {
			t.Errorf("%s: %d succeeded charges or units of usage, want exactly 1", c, perKey[c])
		}
	}
	for c, n := range perKey {
		if n > 1 {
			t.Errorf("%s: %d succeeded charges or units of usage, want at most 1 (an event lost with the old primary may have been billed once)", c, n)
		}
	}
	if d := r.sim.Duplicates(); len(d) != 0 {
		t.Errorf("%d duplicate charge groups at the emulator, first %+v", len(d), d[0])
	}
	if l, err := r.rdb.XLen(ctx, r.stream+":dead").Result(); err != nil || l != 0 {
		t.Errorf("%d dead letters (%v), want none", l, err)
	}
	for _, p := range r.procs {
		select {
		case err := <-p.done:
			p.done <- err
			t.Errorf("%s exited during the failover: %v\n%s", p.name, err, p.out.String())
		default:
		}
	}
	t.Logf("%d events in the promoted primary's stream, each charged once; %d charges in all (events lost with the old primary's last second included)",
		len(inStream), r.charged())
}

// dump fails the test with what the run looks like: counts, the PEL, and
// the end of each process's output.
func (r *sentinelRun) dump(why string) {
	r.t.Helper()
	var b strings.Builder
	pend, err := r.rdb.XPending(context.Background(), r.stream, "billing-group").Result()
	fmt.Fprintf(&b, "%s: %d charged, %d added, XPENDING %+v %v\n", why, r.charged(), r.next.Load(), pend, err)
	for _, p := range r.procs {
		lines := strings.Split(strings.TrimSpace(p.out.String()), "\n")
		fmt.Fprintf(&b, "--- %s (last lines)\n%s\n", p.name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	r.t.Fatal(b.String())
}

func (r *sentinelRun) perKey() map[string]int {
	out := map[string]int{}
	if r.meter {
		for i := range int(r.next.Load()) + 1 {
			if v := r.sim.MeterTotal(sentinelMeter, meterCustomer(i)); v != 0 {
				out[meterCustomer(i)] = int(v)
			}
		}
		return out
	}
	for _, ch := range r.sim.Charges() {
		if ch.Status == "succeeded" && ch.Metadata["billing_period"] == sentinelPeriod {
			out[ch.Metadata["customer_id"]]++
		}
	}
	return out
}

// checkPrimaryLog: each process logged exactly one WARN per change of
// primary, in order, naming the old and the new one, and go-redis's
// routine sentinel lines at INFO.
func (r *sentinelRun) checkPrimaryLog(path ...*redissentinel.Node) {
	for _, p := range r.procs {
		out := p.out.String()
		var warns []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "Redis primary changed") {
				warns = append(warns, l)
			}
			if strings.Contains(l, "sentinel: new master") && !strings.Contains(l, "level=INFO") {
				r.t.Errorf("%s: go-redis's routine sentinel line not at INFO: %s", p.name, l)
			}
		}
		ok := len(warns) == len(path)-1
		for i := 0; ok && i < len(warns); i++ {
			ok = strings.Contains(warns[i], "level=WARN") && strings.Contains(warns[i], "old_primary="+path[i].Addr()) &&
				strings.Contains(warns[i], "new_primary="+path[i+1].Addr())
		}
		if !ok {
			r.t.Errorf("%s: primary-change lines %q, want one WARN for each step of %v", p.name, warns, addrs(path))
		}
	}
}

func addrs(nodes []*redissentinel.Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Addr()
	}
	return out
}

// How a scenario moves the primary, while the producer and the roles run.
// It returns the primaries in order, the first included, and the moment
// the first move began.
type primaryMove func(t *testing.T, set *redissentinel.Set) ([]*redissentinel.Node, time.Time)

// killPrimary SIGKILLs the primary (and, with sentinelToo, one sentinel at
// the same moment) and waits for the promotion.
func killPrimary(sentinelToo bool) primaryMove {
	return func(t *testing.T, set *redissentinel.Set) ([]*redissentinel.Node, time.Time) {
		ctx := context.Background()
		old, err := set.Primary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		set.Kill(old)
		if sentinelToo {
			set.Kill(set.Sentinels[0])
		}
		np, err := set.WaitPromoted(ctx, old, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("SIGKILL of %s (and a sentinel: %v); the sentinels name %s %.2fs later", old.Addr(), sentinelToo, np.Addr(), time.Since(killed).Seconds())
		return []*redissentinel.Node{old, np}, killed
	}
}

// switchOverAndBack asks the sentinels for a planned switch-over
// (SENTINEL FAILOVER), then for another, back to the first primary.
func switchOverAndBack(t *testing.T, set *redissentinel.Set) ([]*redissentinel.Node, time.Time) {
	ctx := context.Background()
	first, err := set.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	second, err := set.Failover(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // billing through the second primary for a moment
	back, err := set.Failover(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if back != first {
		t.Fatalf("switched back to %s, want %s", back.Addr(), first.Addr())
	}
	t.Logf("SENTINEL FAILOVER to %s and back to %s in %.2fs", second.Addr(), back.Addr(), time.Since(began).Seconds())
	return []*redissentinel.Node{first, second, back}, began
}

// runSentinelScenario bills under load while move moves the primary, then
// checks every event of the final primary's stream was charged exactly
// once, the PEL drained, every role kept running and logged each change
// once; it returns the seconds from the move to the first charge of an
// event added after it.
func runSentinelScenario(t *testing.T, move primaryMove, meter bool) float64 {
	set := startSentinels(t)
	r := newSentinelRun(t, set, meter)
	r.produce(5 * time.Millisecond)
	testenv.Eventually(t, 60*time.Second, func() bool { return r.charged() >= 150 }, "billing under way")
	path, moved := move(t, set)
	deadline := time.Now().Add(60 * time.Second)
	for f, ok := r.firstChargeAfter(moved); !ok || f <= 0; f, ok = r.firstChargeAfter(moved) {
		if time.Now().After(deadline) {
			r.dump("no charge through the new primary within 60s")
		}
		time.Sleep(25 * time.Millisecond)
	}
	time.Sleep(time.Second) // load a moment longer
	r.stopProducing()
	r.settle(90 * time.Second)
	first, _ := r.firstChargeAfter(moved)
	r.checkPrimaryLog(path...)
	last := path[len(path)-1]
	for _, p := range r.procs {
		if code, body := get(t, "http://"+p.addr()+"/readyz"); code != 200 || !strings.Contains(body, "redis primary: "+last.Addr()) {
			t.Errorf("%s /readyz %d %q, want 200 naming %s", p.name, code, body, last.Addr())
		}
		p.stop()
	}
	set.Stop()
	return first
}

// Two consumers and the reaper bill through the sentinels; the primary is
// SIGKILLed under load (appendfsync everysec, asynchronous replication:
// acks, claims and group moves of its last moments are lost) and the
// replica promoted. Every event in the promoted primary's stream is charged
// exactly once, the PEL drains, every process keeps running and logs one
// WARN naming the old and the new primary; /readyz names the new one.
// PELGUARD_SENTINEL_RUNS=5 repeats it and reports the median of the seconds
// from the SIGKILL to the first charge through the new primary.
func TestSentinelFailoverBillsOnce(t *testing.T) {
	t.Parallel()
	runs, _ := strconv.Atoi(os.Getenv("PELGUARD_SENTINEL_RUNS"))
	var firsts []float64
	for range max(runs, 1) {
		firsts = append(firsts, runSentinelScenario(t, killPrimary(false), false))
	}
	slices.Sort(firsts)
	t.Logf("seconds from SIGKILL to the first charge through the new primary (down-after-milliseconds 1000, quorum 2, 3 sentinels): %.2f, median %.2f",
		firsts, firsts[len(firsts)/2])
}

// The same with one of the three sentinels SIGKILLed together with the
// primary: the two left are still a quorum and a majority.
func TestSentinelFailoverWithASentinelDown(t *testing.T) {
	t.Parallel()
	first := runSentinelScenario(t, killPrimary(true), false)
	t.Logf("first charge through the new primary %.2fs after the SIGKILL", first)
}

// A planned switch-over (SENTINEL FAILOVER) and another back, under load:
// the same guarantees, one WARN per change.
func TestSentinelSwitchOverAndBack(t *testing.T) {
	t.Parallel()
	runSentinelScenario(t, switchOverAndBack, false)
}

// The same failover for usage: two `consumer meter-events` and the reaper
// (--meter-stream) send meter events through the sentinels; the primary is
// SIGKILLed under load. Each event has a Stripe customer of its own, so
// usage at the emulator is exact when every customer of the promoted
// primary's stream counts 1 and none counts more.
func TestSentinelFailoverMeterEventsOnce(t *testing.T) {
	t.Parallel()
	first := runSentinelScenario(t, killPrimary(false), true)
	t.Logf("first meter event through the new primary %.2fs after the SIGKILL", first)
}

// Bad Sentinel settings stop the binaries at start with a message that
// names the fix, never a password: no master_name or an option that reads
// from replicas, exit 2; a master name the sentinels do not know, exit 3
// after --wait-for-deps naming the name and the sentinels asked; no
// sentinel reachable, exit 3 naming them.
func TestSentinelStartupErrors(t *testing.T) {
	t.Parallel()
	set := startSentinels(t)
	_, dbURL := testenv.DBWithURL(t)
	good := set.URL()
	sentinels := good[len("redis+sentinel://"):]
	sentinels = sentinels[strings.Index(sentinels, "@")+1 : strings.Index(sentinels, "/")]
	closed := "redis+sentinel://:" + url.QueryEscape(sentinelDataPassword) + "@127.0.0.1:1,127.0.0.1:2/0?master_name=pelguard"
	for _, c := range []struct {
		name, url string
		code      int
		want      []string
	}{
		{"no master_name", strings.Replace(good, "master_name=pelguard", "db=0", 1), 2, []string{"master_name"}},
		{"route_by_latency", good + "&route_by_latency=true", 2, []string{"route_by_latency", "primary"}},
		{"replica_only", good + "&replica_only=true", 2, []string{"replica_only"}},
		{"password parameter", good + "&password=x", 2, []string{"option password"}},
		{"unknown master", strings.Replace(good, "master_name=pelguard", "master_name=nosuch", 1), 3,
			[]string{`know no master named "nosuch"`, sentinels, "within --wait-for-deps 2s"}},
		{"no sentinel", closed, 3, []string{"127.0.0.1:1,127.0.0.1:2", "did not answer"}},
	} {
		for _, bin := range []string{"consumer", "reaper"} {
			env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+c.url, "STRIPE_API_KEY="+testKey, "STRIPE_API_BASE=http://127.0.0.1:1")
			res := runBin(t, bin, env, time.Minute, "--metrics-addr", "", "--wait-for-deps", "2s")
			if res.code != c.code {
				t.Errorf("%s, %s: exit %d, want %d\n%s", c.name, bin, res.code, c.code, res.out)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(res.out, w) {
					t.Errorf("%s, %s: output does not name %q:\n%s", c.name, bin, w, res.out)
				}
			}
		}
	}
}
