package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	promDir   = "../prometheus"
	dashboard = "../grafana/pelguard.json"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type ruleTestFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func ruleFiles(t *testing.T) (rules, tests []string) {
	t.Helper()
	all, _ := filepath.Glob(filepath.Join(promDir, "*.yaml"))
	for _, f := range all {
		if strings.HasSuffix(f, "_test.yaml") {
			tests = append(tests, f)
		} else {
			rules = append(rules, f)
		}
	}
	if len(rules) == 0 || len(tests) == 0 {
		t.Fatalf("rule files %v, rule tests %v", rules, tests)
	}
	return rules, tests
}

// readYAML reads the fields these checks need (promtool checks the rest).
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(tool(t, "promtool", "prometheus"), args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// jobLabel finds a query that depends on the job label: under the usual
// kubernetes-pods job (prometheus.io annotations) or a PodMonitor, job is
// whatever the scrape config says, not "pelguard".
var jobLabel = regexp.MustCompile(`\bjob\b`)

// promtool check rules, and no rule reads the job label.
func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	rules, _ := ruleFiles(t)
	for _, f := range rules {
		var rf ruleFile
		readYAML(t, f, &rf)
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if jobLabel.MatchString(r.Expr) {
					t.Errorf("%s %s%s: the expression depends on the job label: %s", f, r.Alert, r.Record, r.Expr)
				}
			}
		}
	}
	promtool(t, append([]string{"check", "rules"}, rules...)...)
}

// promtool test rules passes, the tests load every rule file, and every
// alert has a test in which it fires.
func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	rules, tests := ruleFiles(t)
	fires := map[string]bool{}
	loaded := map[string]bool{}
	for _, f := range tests {
		var tf ruleTestFile
		readYAML(t, f, &tf)
		for _, r := range tf.RuleFiles {
			loaded[filepath.Join(promDir, r)] = true
		}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				}
			}
		}
	}
	for _, f := range rules {
		if !loaded[f] {
			t.Errorf("no rule test loads %s", f)
		}
		var rf ruleFile
		readYAML(t, f, &rf)
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" && !fires[r.Alert] {
					t.Errorf("%s: alert %s has no promtool test in which it fires", f, r.Alert)
				}
			}
		}
	}
	promtool(t, append([]string{"test", "rules"}, tests...)...)
}

type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// The dashboard's queries parse as PromQL (each is checked by promtool as
// a recording rule) and none depends on the job label, in its matchers,
// its grouping or its legend.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	var walk func([]panel)
	n := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				n++
				if jobLabel.MatchString(tg.Expr) || jobLabel.MatchString(tg.LegendFormat) {
					t.Errorf("panel %d %q: depends on the job label: %s (legend %q)", p.ID, p.Title, tg.Expr, tg.LegendFormat)
				}
				expr, _ := json.Marshal(tg.Expr) // a JSON string is a YAML string
				fmt.Fprintf(&rules, "      - record: dashboard:panel_%d_%s\n        expr: %s\n", p.ID, tg.RefID, expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if q, _ := json.Marshal(v.Query); jobLabel.Match(q) {
			t.Errorf("a dashboard variable depends on the job label: %s", q)
		}
	}
	if n < 20 {
		t.Fatalf("%d queries in the dashboard", n)
	}
	f := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", f)
	if t.Failed() {
		t.Logf("queries checked:\n%s", rules.String())
	}
}
