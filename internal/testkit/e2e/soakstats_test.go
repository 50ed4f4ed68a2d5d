package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/stripesim"
)

// sampler records the soak's series: one point per series and sample.
type sampler struct {
	t       *testing.T
	rdb     *redis.Client
	admin   *pgxpool.Pool
	schema  string
	streams []string
	procs   []*proc
	addrs   map[string]string
	start   time.Time
	load0   string // load average as the fleet started

	mu     sync.Mutex
	points []point
}

type point struct {
	Minute float64 `json:"minute"` // since the fleet started
	Series string  `json:"series"`
	Value  float64 `json:"value"`
}

// sample takes one of each series. A value it cannot read is left out
// (and logged): a missing point is visible, a zero would bend the slope.
func (s *sampler) sample(ctx context.Context) {
	m := time.Since(s.start).Minutes()
	var pts []point
	add := func(series string, v float64) { pts = append(pts, point{m, series, v}) }
	if info, err := s.rdb.Info(ctx, "memory").Result(); err == nil {
		if v, ok := infoField(info, "used_memory"); ok {
			add("redis_used_memory_bytes", v)
		}
	} else {
		s.t.Logf("sample: INFO memory: %v", err)
	}
	for _, st := range s.streams {
		if n, err := s.rdb.XLen(ctx, st).Result(); err == nil || err == redis.Nil {
			add("xlen:"+st, float64(n))
		}
	}
	// Partitioned tables (meter_events) are summed over their partitions.
	rows, err := s.admin.Query(ctx, `SELECT c.relname, CASE WHEN c.relkind = 'p'
		THEN (SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0) FROM pg_partition_tree(c.oid) p)
		ELSE pg_total_relation_size(c.oid) END
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition`, s.schema)
	if err == nil {
		for rows.Next() {
			var name string
			var size int64
			if rows.Scan(&name, &size) == nil {
				add("table_bytes:"+name, float64(size))
			}
		}
		rows.Close()
	} else {
		s.t.Logf("sample: table sizes: %v", err)
	}
	for _, p := range s.procs {
		if kb, ok := vmRSS(p.cmd.Process.Pid); ok {
			add("rss_bytes:"+p.name, kb*1024)
		}
		if _, body := get(s.t, "http://"+s.addrs[p.name]+"/metrics"); body != "" {
			if v, ok := metric(body, "go_goroutines"); ok {
				add("goroutines:"+p.name, v)
			}
		}
	}
	s.mu.Lock()
	s.points = append(s.points, pts...)
	s.mu.Unlock()
}

func infoField(info, key string) (float64, bool) {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+":"); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// vmRSS reads VmRSS (kB) from /proc/PID/status.
func vmRSS(pid int) (float64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb, err == nil
		}
	}
	return 0, false
}

// metric reads an unlabelled sample from a Prometheus text exposition.
func metric(body, name string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// slope is a series' least-squares line over the points after warm-up.
type slope struct {
	PerMinute float64 `json:"per_minute"`
	Mean      float64 `json:"mean"`
	First     float64 `json:"first"`
	Last      float64 `json:"last"`
	Points    int     `json:"points"`
}

func leastSquares(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

type soakResult struct {
	Params   map[string]string `json:"params"`
	LoadAvg  map[string]string `json:"loadavg"`
	WarmupM  float64           `json:"warmup_minutes"`
	Slopes   map[string]slope  `json:"slopes"`
	Produced map[string]int    `json:"produced"`
	Money    map[string]int    `json:"money"`
}

// report fits each series after the warm-up: two retention cycles and
// one sample interval, so that trimming has reached its steady state.
func (s *sampler) report(p params) soakResult {
	warm := (2*p.retention + p.sample).Minutes()
	by := map[string][2][]float64{}
	s.mu.Lock()
	for _, pt := range s.points {
		if pt.Minute < warm-0.01 {
			continue
		}
		xy := by[pt.Series]
		xy[0], xy[1] = append(xy[0], pt.Minute), append(xy[1], pt.Value)
		by[pt.Series] = xy
	}
	s.mu.Unlock()
	res := soakResult{WarmupM: warm, Slopes: map[string]slope{}, LoadAvg: map[string]string{"start": s.load0, "end": loadAvg()},
		Params: map[string]string{"duration": p.duration.String(), "retention": p.retention.String(), "sample": p.sample.String(),
			"rate_per_stream": fmt.Sprint(p.rate), "stripe_rate": fmt.Sprint(p.stripeRate)}}
	for name, xy := range by {
		var sum float64
		for _, y := range xy[1] {
			sum += y
		}
		res.Slopes[name] = slope{PerMinute: leastSquares(xy[0], xy[1]), Mean: sum / float64(len(xy[1])),
			First: xy[1][0], Last: xy[1][len(xy[1])-1], Points: len(xy[1])}
	}
	return res
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// write puts samples.csv and summary.json into SOAK_OUT and logs the slopes.
func (s *sampler) write(t *testing.T, p params, res soakResult) {
	t.Helper()
	var csv strings.Builder
	csv.WriteString("minute,series,value\n")
	s.mu.Lock()
	for _, pt := range s.points {
		fmt.Fprintf(&csv, "%.2f,%s,%.0f\n", pt.Minute, pt.Series, pt.Value)
	}
	s.mu.Unlock()
	sum, _ := json.MarshalIndent(res, "", "  ")
	for name, body := range map[string][]byte{"samples.csv": []byte(csv.String()), "summary.json": sum} {
		if err := os.WriteFile(filepath.Join(p.out, name), body, 0o644); err != nil {
			t.Error(err)
		}
	}
	names := make([]string, 0, len(res.Slopes))
	for n := range res.Slopes {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "slopes after %.1f min (least squares, per minute), load average at the start %s, at the end %s:\n", res.WarmupM, res.LoadAvg["start"], res.LoadAvg["end"])
	for _, n := range names {
		sl := res.Slopes[n]
		fmt.Fprintf(&b, "  %-60s %12.1f/min  mean %14.0f  first %14.0f  last %14.0f  (%d points)\n", n, sl.PerMinute, sl.Mean, sl.First, sl.Last, sl.Points)
	}
	fmt.Fprintf(&b, "samples and summary in %s", p.out)
	t.Log(b.String())
}

// checkNothingLostOrDoubled accounts for every produced event. Charges:
// at most one succeeded charge per customer and period at the emulator;
// each "bill" event exactly one, each "decline" event a declined ledger
// row, each "bad" one dead-lettered with a reason. Meter events: the
// emulator holds each identifier at most once, each customer's count is
// what was produced minus what was dead-lettered with a reason.
func checkNothingLostOrDoubled(t *testing.T, sim *stripesim.Server, admin *pgxpool.Pool, schema string, rdb *redis.Client,
	charges, meters string, prod *produced) map[string]int {
	t.Helper()
	out := map[string]int{}
	if d := sim.Duplicates(); len(d) > 0 {
		t.Errorf("%d customers charged twice for one period (first: %+v)", len(d), d[0])
	}
	out["duplicate_charges"] = len(sim.Duplicates())
	succeeded := map[string]int{}
	for _, c := range sim.Charges() {
		if c.Status == "succeeded" {
			succeeded[c.Metadata["customer_id"]+"/"+c.Metadata["billing_period"]]++
		}
	}
	status := map[string]string{}
	rows, err := admin.Query(context.Background(), "SELECT customer_id, status FROM "+schema+".billing_records")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c, s string
		if err := rows.Scan(&c, &s); err != nil {
			t.Fatal(err)
		}
		status[c] = s
	}
	rows.Close()
	dead := deadReasons(t, rdb, charges+":dead")
	var lost []string
	for _, c := range prod.charges {
		n := succeeded[c.customer+"/2026-11"]
		switch {
		case n > 1:
			out["charged_twice"]++ // also in Duplicates
		case c.kind == "bill" && n == 1 && status[c.customer] == "charged":
			out["charged"]++
		case c.kind == "decline" && n == 0 && status[c.customer] == "declined":
			out["declined"]++
		case dead[c.payload] != "":
			out["charge_dead_lettered"]++
		default:
			lost = append(lost, fmt.Sprintf("%s (%s: %d charges, ledger %q)", c.customer, c.kind, n, status[c.customer]))
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d charge events neither billed once, declined nor dead-lettered with a reason; first: %v",
			len(lost), len(prod.charges), lost[:min(5, len(lost))])
	}
	out["charge_unaccounted"] = len(lost)

	seen := map[string]int{}
	perCustomer := map[string]int{}
	for _, e := range sim.MeterEvents(soakMeter, "") {
		if e.Cancelled {
			continue
		}
		seen[e.Identifier]++
		perCustomer[e.Customer]++
	}
	for id, n := range seen {
		if n > 1 {
			out["meter_identifier_twice"]++
			t.Errorf("meter event %s recorded %d times", id, n)
		}
	}
	mdead := deadReasons(t, rdb, meters+":dead")
	want := map[string]int{}
	for _, e := range prod.meters {
		if mdead[e.Payload()] != "" {
			out["meter_dead_lettered"]++
			continue
		}
		want[e.StripeCustomerID]++
	}
	for cus, n := range want {
		if perCustomer[cus] != n {
			out["meter_customers_off"]++
			t.Errorf("meter: %s has %d events at Stripe, %d produced and not dead-lettered", cus, perCustomer[cus], n)
		}
		out["meter_counted"] += perCustomer[cus]
	}
	t.Logf("accounted: %v", out)
	return out
}
