package chaos

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"text/tabwriter"
	"time"
)

// WriteTable writes the drill's tables: the charges, one row per scenario
// and mode (a cell that did not finish is marked FAILED, with the counts it
// reached), then, when usage scenarios ran, the usage table; then any
// skipped scenario with its reason, and, when a cell failed, why and that
// the verdicts do not hold: a pasted table must not pass for a clean run.
func (r Report) WriteTable(w io.Writer) error {
	if len(r.Results) > 0 || (len(r.Usage) == 0 && len(r.Busy) == 0) {
		if err := r.writeChargeTable(w); err != nil {
			return err
		}
	}
	if len(r.Usage) > 0 {
		if len(r.Results) > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := r.writeUsageTable(w); err != nil {
			return err
		}
	}
	if len(r.Busy) > 0 {
		if len(r.Results) > 0 || len(r.Usage) > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := r.writeBusyTable(w); err != nil {
			return err
		}
	}
	for _, s := range r.Skipped {
		if _, err := fmt.Fprintf(w, "SKIPPED %s: %s\n", s.Scenario, s.Reason); err != nil {
			return err
		}
	}
	if !r.Incomplete() {
		return nil
	}
	for _, x := range r.Results {
		if x.Failed() {
			if _, err := fmt.Fprintf(w, "FAILED %s/%s: %s\n", x.Scenario, x.Mode, x.Error); err != nil {
				return err
			}
		}
	}
	for _, x := range r.Usage {
		if x.Failed() {
			if _, err := fmt.Fprintf(w, "FAILED %s/%s: %s\n", x.Scenario, x.Mode, x.Error); err != nil {
				return err
			}
		}
	}
	for _, x := range r.Busy {
		if x.Failed() {
			if _, err := fmt.Fprintf(w, "FAILED %s/%s: %s\n", x.Scenario, x.Mode, x.Error); err != nil {
				return err
			}
		}
	}
	_, err := fmt.Fprintln(w, "INCOMPLETE: the verdicts do not hold")
	return err
}

func (r Report) writeChargeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tmode\tevents\tcharges\tduplicate charges\tdollars double-charged\tflagged\trefunded\tnet duplicates after refunds\t")
	for _, x := range r.Results {
		mark := ""
		if x.Failed() {
			mark = "  FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\n", x.Scenario, x.Mode, x.Events, x.Charges,
			x.DuplicateCharges, Dollars(x.DuplicateCents), x.Flagged, x.Refunded, x.NetDuplicates, mark)
	}
	return tw.Flush()
}

// writeUsageTable writes the usage scenarios' table: per scenario and mode,
// what the events add up to, what Stripe's summaries add up to, and the
// over-count.
func (r Report) writeUsageTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "usage scenario\tmode\tevents\tcustomers\texpected units\tStripe units\tover-count units\tover-count events\tcustomers over-counted\tunder-count units\tparked (alerted)\t")
	for _, x := range r.Usage {
		mark := ""
		if x.Failed() {
			mark = "  FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d (%d)\t%s\n", x.Scenario, x.Mode, x.Events, x.Customers,
			x.ExpectedUnits, x.StripeUnits, x.OverCountUnits, x.OverCountEvents, x.OverCountedCustomers, x.UnderCountUnits,
			x.Parked, x.Alerted, mark)
	}
	return tw.Flush()
}

// WriteJSON writes the results as a JSON object with two arrays, the
// drill's two tables: "charges", objects with exactly the fields scenario,
// mode, events, charges, duplicate_charges, duplicate_cents, flagged,
// refunded and net_duplicates; and "usage", objects with exactly scenario,
// mode, events, customers, expected_units, stripe_units, overcount_units,
// overcount_events, overcounted_customers, undercount_units, parked and
// alerted; and, only when usage-busy-customer ran, "busy_customer", objects
// with BusyResult's fields. A row whose cell did not finish also has error.
func (r Report) WriteJSON(w io.Writer) error {
	out := struct {
		Charges []Result      `json:"charges"`
		Usage   []UsageResult `json:"usage"`
		Busy    []BusyResult  `json:"busy_customer,omitempty"`
	}{r.Results, r.Usage, r.Busy}
	if out.Charges == nil {
		out.Charges = []Result{}
	}
	if out.Usage == nil {
		out.Usage = []UsageResult{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// WriteHTML writes a self-contained report (no external asset: a team can
// mail it or attach it to a ticket): a bar chart of charges and duplicates
// per scenario and mode as inline SVG, the table, and the verdicts.
func (r Report) WriteHTML(w io.Writer) error {
	return htmlReport.Execute(w, r.htmlData())
}

type bar struct {
	X, Y, W, H int
	Class      string
	Title      string
}

type group struct {
	X     int
	Label string
	Mode  string
}

type htmlData struct {
	Report   Report
	Bars     []bar
	Groups   []group
	Width    int
	Height   int
	Base     int
	Ticks    []tick
	Failures []string
	When     string
	// Explained are the scenarios this run ran, each in a sentence.
	Explained []explainedScenario
	// BusyChart is usage-busy-customer's chart (busyout.go); nil when it
	// did not run.
	BusyChart *busyChart
}

type explainedScenario struct{ Name, FailureMode, Sentence string }

type tick struct {
	Y     int
	Label int
}

func (r Report) htmlData() htmlData {
	const (
		barW, gap, groupGap, left, top, plotH = 26, 4, 30, 50, 20, 220
	)
	maxV := 1
	for _, x := range r.Results {
		maxV = max(maxV, x.Charges, x.DuplicateCharges)
	}
	scale := func(v int) int { return v * plotH / maxV }
	d := htmlData{Report: r, Base: top + plotH, Failures: r.Failures(), When: time.Now().UTC().Format(time.RFC3339), BusyChart: r.busyChartOf()}
	x := left + gap
	for _, res := range r.Results {
		for i, v := range []struct {
			n     int
			class string
			what  string
		}{{res.Charges, "charges", "charges"}, {res.DuplicateCharges, "dups", "duplicate charges"}} {
			h := scale(v.n)
			d.Bars = append(d.Bars, bar{X: x + i*(barW+gap), Y: d.Base - h, W: barW, H: h, Class: v.class,
				Title: fmt.Sprintf("%s / %s: %d %s", res.Scenario, res.Mode, v.n, v.what)})
		}
		mode := res.Mode
		if res.Failed() {
			mode += " (FAILED)"
		}
		d.Groups = append(d.Groups, group{X: x + barW + gap/2, Label: res.Scenario, Mode: mode})
		x += 2*(barW+gap) + groupGap
	}
	ran := map[string]bool{}
	for _, res := range r.Results {
		ran[res.Scenario] = true
	}
	for _, u := range r.Usage {
		ran[u.Scenario] = true
	}
	for _, b := range r.Busy {
		ran[b.Scenario] = true
	}
	for _, sc := range Scenarios {
		if ran[sc.Name] {
			d.Explained = append(d.Explained, explainedScenario{sc.Name, sc.FailureMode, Explain(sc.Name)})
		}
	}
	d.Width, d.Height = max(x+left, 300), d.Base+60
	for _, f := range []int{0, 1, 2, 3, 4} {
		v := maxV * f / 4
		d.Ticks = append(d.Ticks, tick{Y: d.Base - scale(v), Label: v})
	}
	return d
}

var htmlReport = template.Must(template.New("report").Funcs(template.FuncMap{
	"dollars": Dollars,
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>pelguard drill: naive vs pelguard</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:70em}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,td:nth-child(2){text-align:left}
tr.naive td,tr.naive-identifier td{background:#fff6f4}tr.pelguard td{background:#f4fbf4}tr.failed td{background:#fbe0e0;font-weight:bold}
.charges{fill:#4a7bd0}.dups{fill:#d9412b}.axis{stroke:#999}.lbl{font-size:11px;fill:#444}
.ok{color:#1a7f37}.bad{color:#c62828}
</style></head><body>
<h1>pelguard drill</h1>
<p>Failure modes of Redis Streams billing run against a naive consumer and <code>XAUTOCLAIM</code> monitor, then against
pelguard (consumer + reaper); the auditor then flags the naive run's duplicates and refunds them.
{{.Report.Events}} events per scenario and mode, seed {{.Report.Seed}}, generated {{.When}}.</p>
{{if .Explained}}<h2>The scenarios</h2>
<dl>{{range .Explained}}<dt><code>{{.Name}}</code>: {{.FailureMode}}</dt><dd>{{.Sentence}}</dd>
{{end}}</dl>{{end}}
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" role="img" aria-label="charges and duplicate charges per scenario and mode">
{{range .Ticks}}<line class="axis" x1="45" x2="{{$.Width}}" y1="{{.Y}}" y2="{{.Y}}" stroke-dasharray="2,3"/><text class="lbl" x="40" y="{{.Y}}" text-anchor="end" dy="4">{{.Label}}</text>
{{end}}{{range .Bars}}<rect class="{{.Class}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Groups}}<text class="lbl" x="{{.X}}" y="{{$.Base}}" dy="16" text-anchor="middle">{{.Mode}}</text><text class="lbl" x="{{.X}}" y="{{$.Base}}" dy="30" text-anchor="middle">{{.Label}}</text>
{{end}}<rect class="charges" x="50" y="{{$.Base}}" transform="translate(0,40)" width="10" height="10"/><text class="lbl" x="64" y="{{$.Base}}" dy="49">charges</text>
<rect class="dups" x="130" y="{{$.Base}}" transform="translate(0,40)" width="10" height="10"/><text class="lbl" x="144" y="{{$.Base}}" dy="49">duplicate charges</text>
</svg>
<table>
<tr><th>scenario</th><th>mode</th><th>events</th><th>charges</th><th>duplicate charges</th><th>dollars double-charged</th><th>flagged</th><th>refunded</th><th>net duplicates after refunds</th>{{if .Report.Incomplete}}<th>status</th>{{end}}</tr>
{{range .Report.Results}}<tr class="{{.Mode}}{{if .Failed}} failed{{end}}"><td>{{.Scenario}}</td><td>{{.Mode}}</td><td>{{.Events}}</td><td>{{.Charges}}</td><td>{{.DuplicateCharges}}</td><td>{{dollars .DuplicateCents}}</td><td>{{.Flagged}}</td><td>{{.Refunded}}</td><td>{{.NetDuplicates}}</td>{{if $.Report.Incomplete}}<td class="{{if .Failed}}bad{{else}}ok{{end}}">{{if .Failed}}FAILED: {{.Error}}{{else}}finished{{end}}</td>{{end}}</tr>
{{end}}</table>
{{if .Report.Usage}}<h2>Usage to Stripe Billing Meters</h2>
<p>Meter events instead of charges, in three modes: naive (no identifier), naive-identifier (the event id as
identifier, no ledger) and pelguard (meter consumer and ledger). Counted at the emulator: each customer's total
from the meter's event summaries against what the customer's events add up to.</p>
<table>
<tr><th>usage scenario</th><th>mode</th><th>events</th><th>customers</th><th>expected units</th><th>Stripe units</th><th>over-count units</th><th>over-count events</th><th>customers over-counted</th><th>under-count units</th><th>parked (alerted)</th>{{if .Report.Incomplete}}<th>status</th>{{end}}</tr>
{{range .Report.Usage}}<tr class="{{.Mode}}{{if .Failed}} failed{{end}}"><td>{{.Scenario}}</td><td>{{.Mode}}</td><td>{{.Events}}</td><td>{{.Customers}}</td><td>{{.ExpectedUnits}}</td><td>{{.StripeUnits}}</td><td>{{.OverCountUnits}}</td><td>{{.OverCountEvents}}</td><td>{{.OverCountedCustomers}}</td><td>{{.UnderCountUnits}}</td><td>{{.Parked}} ({{.Alerted}})</td>{{if $.Report.Incomplete}}<td class="{{if .Failed}}bad{{else}}ok{{end}}">{{if .Failed}}FAILED: {{.Error}}{{else}}finished{{end}}</td>{{end}}</tr>
{{end}}</table>{{end}}
{{template "busy" .}}
{{range .Report.Skipped}}<p class="bad">SKIPPED {{.Scenario}}: {{.Reason}}</p>
{{end}}{{if .Report.Incomplete}}<h2 class="bad">Verdicts do not hold: the run is incomplete</h2><ul>{{range .Failures}}<li>{{.}}</li>{{end}}</ul>
{{else if .Failures}}<h2 class="bad">Verdicts do not hold</h2><ul>{{range .Failures}}<li>{{.}}</li>{{end}}</ul>
{{else}}<p class="ok"><strong>Verdicts hold:</strong>{{if .Report.Results}} the naive code double-charged in every scenario, pelguard never did,
the auditor flagged every duplicate and the refunds left none.{{end}}{{if .Report.Usage}} The naive meter sender over-counted usage
(with an identifier, past Stripe's window), pelguard counted every customer's usage exactly.{{end}}{{if .Report.Busy}} At volume the
naive senders fell behind every customer, pelguard counted every event exactly once within the bound.{{end}}</p>{{end}}
</body></html>
`))
