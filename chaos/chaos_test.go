package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestMain doubles as the drill's killed child: partial-batch re-runs the
// test binary with ChildEnv set.
func TestMain(m *testing.M) {
	if code, ok := RunChildIfRequested(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// chargeScenarios and usageScenarios name the scenarios of each table.
func chargeScenarios() []string {
	var out []string
	for _, s := range Scenarios {
		if !s.Usage && !s.Volume {
			out = append(out, s.Name)
		}
	}
	return out
}

func usageScenarios() []string {
	var out []string
	for _, s := range Scenarios {
		if s.Usage {
			out = append(out, s.Name)
		}
	}
	return out
}

func testConfig(t *testing.T, seed int64) Config {
	return Config{
		RedisURL: testenv.RedisURL(), DatabaseURL: testenv.DatabaseURL(),
		Events: minEvents, Seed: seed, MinIdle: 150 * time.Millisecond,
		Logger: testenv.Logger(t),
	}
}

// verdicts is what must not depend on the seed: per scenario and mode,
// whether there were duplicates, and the drill's failures.
func verdicts(r Report) map[string]bool {
	out := map[string]bool{}
	for _, x := range r.Results {
		out[x.Scenario+"/"+x.Mode] = x.DuplicateCharges > 0
	}
	return out
}

// TestDrill runs every scenario with a small N under two seeds and checks
// the drill's promises: naive duplicates > 0, pelguard duplicates = 0, the
// auditor flags exactly the naive duplicates, the refunds leave none, and
// the verdicts are the same whatever the seed.
func TestDrill(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	reports := map[int64]Report{}
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range []int64{1, 20260611} {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				t.Parallel()
				cfg := testConfig(t, seed)
				cfg.Scenarios = chargeScenarios()
				rep, err := Run(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				var table bytes.Buffer
				_ = rep.WriteTable(&table)
				t.Logf("seed %d:\n%s", seed, table.String())
				if len(rep.Skipped) > 0 {
					t.Fatalf("skipped %+v: redis-server is needed for the AOF rollback scenario (make test installs it)", rep.Skipped)
				}
				if got := len(rep.Results); got != 2*len(chargeScenarios()) || len(rep.Usage) != 0 {
					t.Fatalf("%d results and %d usage rows, want %d and 0", got, len(rep.Usage), 2*len(chargeScenarios()))
				}
				for _, x := range rep.Results {
					switch x.Mode {
					case ModeNaive:
						if x.DuplicateCharges == 0 {
							t.Errorf("%s/naive: no duplicate: the drill did not reproduce the failure mode", x.Scenario)
						}
						if x.Refunded != x.DuplicateCharges {
							t.Errorf("%s/naive: refunded %d of %d duplicates", x.Scenario, x.Refunded, x.DuplicateCharges)
						}
					case ModePelguard:
						if x.DuplicateCharges != 0 || x.DuplicateCents != 0 || x.Charges != x.Events {
							t.Errorf("%s/pelguard: %d duplicates (%d cents), %d charges for %d events",
								x.Scenario, x.DuplicateCharges, x.DuplicateCents, x.Charges, x.Events)
						}
					}
					if x.Flagged != x.DuplicateCharges {
						t.Errorf("%s/%s: flagged %d, duplicates %d", x.Scenario, x.Mode, x.Flagged, x.DuplicateCharges)
					}
					if x.NetDuplicates != 0 {
						t.Errorf("%s/%s: %d duplicates left after refunds", x.Scenario, x.Mode, x.NetDuplicates)
					}
				}
				if f := rep.Failures(); len(f) > 0 {
					t.Errorf("failures: %v", f)
				}
				mu.Lock()
				reports[seed] = rep
				mu.Unlock()
			})
		}
	})
	if t.Failed() || len(reports) != 2 {
		return
	}
	a, b := verdicts(reports[1]), verdicts(reports[20260611])
	if len(a) != len(b) {
		t.Fatalf("verdicts differ by seed: %v vs %v", a, b)
	}
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s: duplicates %v with one seed, %v with the other", k, v, b[k])
		}
	}
}

// An interrupted run (SIGINT cancels the context) still removes its
// schemas and streams: a charge scenario's, and a usage scenario's (whose
// pelguard schema is made in the background, and whose three cells run at
// once).
func TestInterruptedRunCleansUp(t *testing.T) {
	t.Parallel()
	for _, sc := range []string{ScenarioInflightReclaim, ScenarioUsageInflightReclaim} {
		t.Run(sc, func(t *testing.T) {
			t.Parallel()
			interruptAndCheck(t, sc)
		})
	}
}

func interruptAndCheck(t *testing.T, scenario string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg := testConfig(t, 7)
	cfg.Scenarios = []string{scenario}
	var runID string
	cfg.onStart = func(id string) { runID = id }
	// Cancel as soon as the pelguard cell, which has a schema, is under way.
	cfg.Progress = writerFunc(func(p []byte) {
		if strings.Contains(string(p), "pelguard: running") {
			cancel()
		}
	})
	_, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if runID == "" {
		t.Fatal("the run never started")
	}
	admin, err := pg.Open(t.Context(), testenv.DatabaseURL(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, "chaos_"+runID+"_%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d schemas of the interrupted run are left", n)
	}
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(t.Context(), "chaos:"+runID+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys left: %v", keys)
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.RedisURL = "" }, "Redis"},
		{func(c *Config) { c.Events = 5 }, "--events"},
		{func(c *Config) { c.Scenarios = []string{"nope"} }, "unknown scenario"},
		{func(c *Config) { c.Scenarios = []string{ScenarioExpiredKey, ScenarioExpiredKey} }, "twice"},
		{func(c *Config) { c.MinIdle = time.Millisecond }, "min-idle"},
	} {
		c := Config{RedisURL: "redis://x", DatabaseURL: "postgres://x"}
		c.setDefaults()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, tc.want)
		}
	}
}

func sampleReport() Report {
	return Report{Seed: 1, Events: 20, Results: []Result{
		{Scenario: ScenarioPartialBatch, Mode: ModeNaive, Events: 20, Charges: 28, DuplicateCharges: 8, DuplicateCents: 12345, Flagged: 8, Refunded: 8},
		{Scenario: ScenarioPartialBatch, Mode: ModePelguard, Events: 20, Charges: 20},
	}, Skipped: []Skip{{Scenario: ScenarioAOFRollback, Reason: "redis-server is not installed"}}}
}

func TestJSONHasExactlyTheDocumentedFields(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var out map[string][]map[string]any
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out["usage"] == nil {
		t.Fatalf("want exactly the charges and usage tables (usage empty, not null): %s", buf.String())
	}
	rows := out["charges"]
	want := []string{"charges", "duplicate_cents", "duplicate_charges", "events", "flagged", "mode", "net_duplicates", "refunded", "scenario"}
	for _, r := range rows {
		var got []string
		for k := range r {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("fields %v, want %v", got, want)
		}
	}
	if rows[0]["duplicate_cents"].(float64) != 12345 {
		t.Fatalf("row %v", rows[0])
	}
}

func TestTableAndHTML(t *testing.T) {
	t.Parallel()
	var table, page bytes.Buffer
	rep := sampleReport()
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"dollars double-charged", "net duplicates after refunds", "$123.45", "SKIPPED aof-rollback"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	h := page.String()
	for _, s := range []string{"<svg", "<rect class=\"dups\"", "partial-batch", "$123.45", "Verdicts hold"} {
		if !strings.Contains(h, s) {
			t.Errorf("HTML lacks %q", s)
		}
	}
	for _, s := range []string{"<script", "http://", "https://"} {
		if strings.Contains(h, s) && !strings.Contains(h, "http://www.w3.org/2000/svg") {
			t.Errorf("HTML is not self-contained: %q", s)
		}
	}
}

func TestFailuresSayWhy(t *testing.T) {
	t.Parallel()
	rep := Report{Results: []Result{
		{Scenario: "s", Mode: ModeNaive, Events: 20, Charges: 20},
		{Scenario: "s", Mode: ModePelguard, Events: 20, Charges: 21, DuplicateCharges: 1, DuplicateCents: 500, Flagged: 0, NetDuplicates: 1},
	}}
	got := strings.Join(rep.Failures(), "\n")
	for _, s := range []string{"did not reproduce", "pelguard made 1 duplicate charge(s) worth $5.00", "flagged 0", "left after the refunds", "exactly once"} {
		if !strings.Contains(got, s) {
			t.Errorf("failures lack %q:\n%s", s, got)
		}
	}
	if f := (Report{}).Failures(); len(f) != 1 {
		t.Errorf("an empty run must fail: %v", f)
	}
}

// A failed cell is a failure of its own, and no other verdict is drawn from
// the counts it happened to reach.
func TestFailedCellFailsTheVerdicts(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	rep.Results[1] = Result{Scenario: ScenarioPartialBatch, Mode: ModePelguard, Events: 20, Charges: 3,
		Error: "the scenario did not finish: no progress for 1m0s"}
	if !rep.Incomplete() {
		t.Fatal("not incomplete")
	}
	f := rep.Failures()
	if len(f) != 1 || !strings.Contains(f[0], "partial-batch/pelguard: FAILED") {
		t.Errorf("failures %q", f)
	}
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if h := page.String(); strings.Contains(h, "Verdicts hold") || !strings.Contains(h, "no progress for 1m0s") {
		t.Errorf("HTML:\n%s", h)
	}
}

// TestHTMLExplainsEachScenario: the report says in a sentence what each
// scenario it shows does, for a reader who has not read the code.
func TestHTMLExplainsEachScenario(t *testing.T) {
	t.Parallel()
	for _, s := range Scenarios {
		if len(Explain(s.Name)) < 60 {
			t.Errorf("scenario %s has no sentence of its own (Explain: %q)", s.Name, Explain(s.Name))
		}
	}
	rep := sampleReport()
	for _, s := range Scenarios {
		if s.Usage {
			rep.Usage = append(rep.Usage, UsageResult{Scenario: s.Name, Mode: ModePelguard})
		}
	}
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	h := page.String()
	ran := map[string]bool{}
	for _, r := range rep.Results {
		ran[r.Scenario] = true
	}
	for _, u := range rep.Usage {
		ran[u.Scenario] = true
	}
	for _, b := range rep.Busy {
		ran[b.Scenario] = true
	}
	for _, s := range Scenarios {
		if want := template.HTMLEscapeString(Explain(s.Name)); ran[s.Name] != strings.Contains(h, want) {
			t.Errorf("scenario %s (in the report: %v): its sentence shown: %v", s.Name, ran[s.Name], !ran[s.Name])
		}
	}
}
