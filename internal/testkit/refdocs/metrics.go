package refdocs

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripelimit"
)

// role is one process that serves /metrics and the metric sets it builds
// on its registry: the same constructors its command calls, so a series
// added to any of them appears here. pelguard-console serves no /metrics.
type role struct {
	name  string // as in pelguard_build_info's role label
	where string // the command that serves them
	build func(reg prometheus.Registerer) error
}

var roles = []role{
	{"consumer", "pelguard-consumer run", func(reg prometheus.Registerer) error {
		consumer.NewMetrics(reg)
		return errs(notifier(reg), limiter(reg, stripelimit.RoleBilling), durability(reg))
	}},
	{"webhook", "pelguard-consumer webhook", func(reg prometheus.Registerer) error {
		consumer.NewWebhookMetrics(reg)
		return errs(notifier(reg), durability(reg))
	}},
	{"reaper", "pelguard-reaper run", func(reg prometheus.Registerer) error {
		reaper.NewMetrics(reg)
		consumer.NewMetrics(reg)
		return errs(notifier(reg), limiter(reg, stripelimit.RoleRedrive), durability(reg))
	}},
	{"auditor", "pelguard-auditor run", func(reg prometheus.Registerer) error {
		audit.NewMetrics(reg)
		return errs(notifier(reg), limiter(reg, stripelimit.RoleAudit), durability(reg))
	}},
}

func errs(es ...error) error {
	for _, e := range es {
		if e != nil {
			return e
		}
	}
	return nil
}

// notifier builds the log-only notifier (no Slack configured): the Slack
// ones register the same pelguard_alerts_* series.
func notifier(reg prometheus.Registerer) error {
	_, err := alerts.New(alerts.Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return err
}

// durability is the ledger's replication mode every role exports at
// start (the auditor with --schedule), and its rollback monitor's series.
func durability(reg prometheus.Registerer) error {
	if _, err := cli.NewRollback("doc", "", "", nil, nil, nil, reg); err != nil {
		return err
	}
	return reg.Register(cli.DurabilityGauge(cli.Durability{}))
}

func limiter(reg prometheus.Registerer, r stripelimit.Role) error {
	_, err := stripelimit.New(stripelimit.Config{Role: r, Rate: 100, Registerer: reg})
	return err
}

// recorder is a Registerer that keeps every collector registered through
// it, so that vectors without a child yet (no series gathered) are listed
// too.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// series is one metric name as the reference lists it.
type series struct {
	Name, Type, Help string
	Labels           []string
	Roles            []string
}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{(.*)\}, variableLabels: \{([^}]*)\}\}$`)
var constLabelRE = regexp.MustCompile(`(?:^|,)([a-zA-Z_][a-zA-Z0-9_]*)=`)

// parseDesc reads name, help and label names (constant and variable) from
// a Desc: client_golang exports them only through String.
func parseDesc(d *prometheus.Desc) (name, help string, labels []string, err error) {
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		return "", "", nil, fmt.Errorf("unexpected Desc format %s", d)
	}
	if name, err = strconv.Unquote(m[1]); err != nil {
		return "", "", nil, err
	}
	if help, err = strconv.Unquote(m[2]); err != nil {
		return "", "", nil, err
	}
	for _, c := range constLabelRE.FindAllStringSubmatch(m[3], -1) {
		labels = append(labels, c[1])
	}
	for _, l := range strings.Split(m[4], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	slices.Sort(labels)
	return name, help, labels, nil
}

// typeOf is a collector's metric type, from its Go type, for the series
// that have no value yet (the gathered ones carry their type). The
// interfaces overlap — a Gauge has every method of a Counter, a Summary
// those of a Histogram, and the Func kinds are bare collectors — so the
// one with more methods is tried first, and an unobserved plain Observer
// (pelguard registers histograms only) reads as a histogram.
func typeOf(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.GaugeVec, prometheus.Gauge:
		return "gauge"
	case *prometheus.CounterVec, prometheus.Counter:
		return "counter"
	case *prometheus.HistogramVec, prometheus.Observer:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// Metrics renders metrics.md.
func Metrics() (string, error) {
	all := map[string]*series{}
	for _, r := range roles {
		rec := &recorder{Registry: cli.NewRegistry(r.name)}
		if err := r.build(rec); err != nil {
			return "", fmt.Errorf("%s: %w", r.name, err)
		}
		found := map[string]*series{}
		// Gathered families: the registry's own (pelguard_build_info) and
		// every series that already has a value; the Go and process
		// collectors' go_* and process_* are left to their own docs.
		mfs, err := rec.Gather()
		if err != nil {
			return "", fmt.Errorf("%s: gathering: %w", r.name, err)
		}
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "pelguard_") {
				continue
			}
			s := &series{Name: mf.GetName(), Help: mf.GetHelp(), Type: strings.ToLower(mf.GetType().String())}
			if len(mf.GetMetric()) > 0 {
				s.Labels = labelNames(mf.GetMetric()[0])
			}
			found[s.Name] = s
		}
		for _, c := range rec.collectors {
			descs := make(chan *prometheus.Desc, 64)
			go func() { c.Describe(descs); close(descs) }()
			for d := range descs {
				name, help, labels, err := parseDesc(d)
				if err != nil {
					return "", err
				}
				s := found[name]
				if s == nil {
					s = &series{Name: name, Help: help, Type: typeOf(c)}
					found[name] = s
				}
				s.Labels = labels
				if s.Type == "" {
					s.Type = typeOf(c)
				}
			}
		}
		for name, s := range found {
			if have := all[name]; have != nil {
				if have.Type != s.Type || have.Help != s.Help || !slices.Equal(have.Labels, s.Labels) {
					return "", fmt.Errorf("%s differs between roles %v and %s", name, have.Roles, r.name)
				}
				have.Roles = append(have.Roles, r.name)
				continue
			}
			s.Roles = []string{r.name}
			all[name] = s
		}
	}
	var b strings.Builder
	b.WriteString(header("Metrics", "the metric sets each role builds, on a fresh registry"))
	b.WriteString("Each long-running command serves these on `--metrics-addr` (`/metrics`), besides the Go and\n" +
		"process collectors' `go_*` and `process_*` series. pelguard-console serves no metrics.\n\n")
	b.WriteString("| Role | Served by |\n|---|---|\n")
	for _, r := range roles {
		fmt.Fprintf(&b, "| %s | `%s` |\n", r.name, r.where)
	}
	b.WriteString("\n| Series | Type | Labels | Roles | Help |\n|---|---|---|---|---|\n")
	for _, name := range slices.Sorted(maps.Keys(all)) {
		s := all[name]
		typ := s.Type
		if typ == "" {
			typ = "untyped"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", s.Name, typ, code(strings.Join(s.Labels, ", ")),
			strings.Join(s.Roles, ", "), cell(s.Help))
	}
	return b.String(), nil
}

func labelNames(m *dto.Metric) []string {
	var ls []string
	for _, lp := range m.GetLabel() {
		ls = append(ls, lp.GetName())
	}
	slices.Sort(ls)
	return ls
}
