package chaos

import (
	"fmt"
	"html/template"
	"io"
	"strings"
	"text/tabwriter"
)

// busySenders says what sends on each side of usage-busy-customer.
var busySenders = map[string]string{
	ModeNaiveIdentifier: "two naive senders (one call per event, in stream order, the event id as identifier) and the XAUTOCLAIM monitor",
	ModePelguard:        "two pelguard meter consumers sending from the ledger (one call per customer and second) and the reaper",
}

// writeBusyTable writes usage-busy-customer's table and, under it, what
// its numbers mean, side by side.
func (r Report) writeBusyTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "volume scenario\tmode\tevents sent\tcounted at Stripe\tbusy customer sent\tcounted when sending ended\tcounted later\tquiet customers short when sending ended (events missing)\tall counted\tStripe calls (refused)\tentries unacknowledged\t")
	for _, x := range r.Busy {
		mark := ""
		if x.Failed() {
			mark = "  FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d (+%gs)\t%d of %d (%d)\t%s\t%d (%d)\t%d\t%s\n", x.Scenario, x.Mode, x.Produced, x.Counted,
			x.BusyProduced, x.BusyAtEnd, x.BusyAfter, x.AfterSeconds, x.QuietShortAtEnd, x.QuietCustomers, x.QuietMissingAtEnd, caughtUp(x),
			x.StripeCalls, x.Refused, x.Backlog, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range r.Busy {
		if x.Failed() {
			continue
		}
		if _, err := fmt.Fprintf(w, "  %s: %s\n", x.Mode, busySummary(x)); err != nil {
			return err
		}
	}
	return nil
}

// caughtUp is the "all counted" cell: how long after sending ended, or
// that it was not within the bound.
func caughtUp(x BusyResult) string {
	if x.CaughtUp() {
		return fmt.Sprintf("after %.1fs", x.CaughtUpSeconds)
	}
	return fmt.Sprintf("not within %gs", x.BoundSeconds)
}

// busySummary says in plain words what a side's numbers mean for the
// invoices.
func busySummary(x BusyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s. ", busySenders[x.Mode])
	rate := float64(x.BusyProduced) / max(x.ProductionSeconds, 1e-9)
	behind := x.BusyProduced - int(x.BusyAtEnd)
	fmt.Fprintf(&b, "When sending ended after %.0fs, Stripe counted %d of the busy customer's %d events", x.ProductionSeconds, x.BusyAtEnd, x.BusyProduced)
	if behind > 0 && rate > 0 {
		fmt.Fprintf(&b, " (%.1fs of its usage behind)", float64(behind)/rate)
	}
	fmt.Fprintf(&b, ", and %d of the %d quiet customers were short (%d of their events not counted yet",
		x.QuietShortAtEnd, x.QuietCustomers, x.QuietMissingAtEnd)
	if q := x.QuietCustomers * x.QuietRate; q > 0 {
		fmt.Fprintf(&b, ", %.1fs of their usage", float64(x.QuietMissingAtEnd)/float64(q))
	}
	b.WriteString("). ")
	if x.CaughtUp() {
		fmt.Fprintf(&b, "Every event was counted %.1fs later, each exactly once, in %d calls (the busy customer's %d events in %d): "+
			"an invoice closed then bills every customer in full.", x.CaughtUpSeconds, x.StripeCalls, x.BusyProduced, x.BusyCalls)
	} else {
		fmt.Fprintf(&b, "%gs later Stripe counted %d of %d events, %d of the quiet customers were still short and %d stream entries unacknowledged: "+
			"an invoice closed then under-bills, and the backlog grows for as long as the busy customer keeps sending.",
			x.BoundSeconds, x.Counted, x.Produced, x.QuietShortAtStop, x.Backlog)
	}
	if x.Refused > 0 {
		fmt.Fprintf(&b, " Stripe refused %d of the %d calls (mostly a call for a customer while another for the same customer was in flight: "+
			"one at a time per customer and meter).", x.Refused, x.StripeCalls)
	}
	if x.OverCounted > 0 {
		fmt.Fprintf(&b, " Stripe counted %d event(s) twice.", x.OverCounted)
	}
	return b.String()
}

// busyChart is usage-busy-customer's chart: events sent, and counted at
// Stripe on each side, over time.
type busyChart struct {
	Width, Height, Left, Right, Top, Base int
	Lines                                 []busyLine
	Ticks                                 []tick
	XTicks                                []busyXTick
	// EndX is where production ended.
	EndX int
}

type busyLine struct {
	Class, Label, Points string
	LegendY              int
}

type busyXTick struct {
	X     int
	Label string
}

// busyChartOf draws the sides' series; nil without one.
func (r Report) busyChartOf() *busyChart {
	var sides []BusyResult
	for _, x := range r.Busy {
		if len(x.Series) > 0 {
			sides = append(sides, x)
		}
	}
	if len(sides) == 0 {
		return nil
	}
	const left, top, plotW, plotH = 60, 20, 560, 220
	maxT, maxV := 1.0, 1
	for _, x := range sides {
		for _, p := range x.Series {
			maxT = max(maxT, p.Seconds)
			maxV = max(maxV, p.Produced)
		}
	}
	ch := &busyChart{Width: left + plotW + 190, Height: top + plotH + 40, Left: left, Right: left + plotW, Top: top, Base: top + plotH}
	xOf := func(s float64) int { return left + int(s*plotW/maxT) }
	yOf := func(v int64) int { return ch.Base - int(v*plotH/int64(maxV)) }
	pts := func(f func(BusyPoint) (float64, int64), series []BusyPoint) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%d,%d", xOf(0), yOf(0))
		for _, p := range series {
			t, v := f(p)
			fmt.Fprintf(&b, " %d,%d", xOf(t), yOf(v))
		}
		return b.String()
	}
	ch.Lines = append(ch.Lines, busyLine{Class: "sent", Label: "events sent",
		Points: pts(func(p BusyPoint) (float64, int64) { return p.Seconds, int64(p.Produced) }, sides[0].Series)})
	for _, x := range sides {
		ch.Lines = append(ch.Lines, busyLine{Class: "c-" + x.Mode, Label: "counted at Stripe: " + x.Mode,
			Points: pts(func(p BusyPoint) (float64, int64) { return p.Seconds, p.Counted }, x.Series)})
	}
	for i := range ch.Lines {
		ch.Lines[i].LegendY = top + 10 + 18*i
	}
	ch.EndX = xOf(sides[0].ProductionSeconds)
	for _, f := range []int{0, 1, 2, 3, 4} {
		v := int64(maxV * f / 4)
		ch.Ticks = append(ch.Ticks, tick{Y: yOf(v), Label: int(v)})
	}
	step := max(5, int(maxT)/60*10)
	for s := 0; float64(s) <= maxT; s += step {
		ch.XTicks = append(ch.XTicks, busyXTick{X: xOf(float64(s)), Label: fmt.Sprintf("%ds", s)})
	}
	return ch
}

// busyHTML is usage-busy-customer's part of the HTML report.
var busyHTML = template.Must(htmlReport.New("busy").Funcs(template.FuncMap{
	"caughtUp": caughtUp, "summary": busySummary, "sender": func(mode string) string { return busySenders[mode] },
}).Parse(`{{if .Report.Busy}}<h2>Usage at volume: one busy customer</h2>
<style>.sent{stroke:#999}.c-naive-identifier{stroke:#d9412b}.c-pelguard{stroke:#1a7f37}.k-sent{fill:#999}.k-c-naive-identifier{fill:#d9412b}.k-c-pelguard{fill:#1a7f37}</style>
{{with index .Report.Busy 0}}<p>One customer sends {{.BusyRate}} usage events a second beside {{.QuietCustomers}} quiet customers sending
{{.QuietRate}} a second each, for {{printf "%.0f" .ProductionSeconds}} s; Stripe answers each meter-event call in {{.LatencyMS}} ms and
refuses a second call for the same customer and meter while one is in flight.{{end}} Both sides get the same events at the same
moments, each on its own stream and Stripe; what Stripe counts is read at the emulator (each event is one unit of a sum meter),
and the drill waits up to {{with index .Report.Busy 0}}{{.BoundSeconds}}{{end}} s after sending ends for everything to be counted.</p>
<ul>{{range .Report.Busy}}<li><b>{{.Mode}}</b>: {{sender .Mode}}.</li>{{end}}</ul>
{{with .BusyChart}}<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" role="img" aria-label="events sent and counted at Stripe over time">
{{range .Ticks}}<line class="axis" x1="{{$.BusyChart.Left}}" x2="{{$.BusyChart.Right}}" y1="{{.Y}}" y2="{{.Y}}" stroke-dasharray="2,3"/><text class="lbl" x="{{$.BusyChart.Left}}" y="{{.Y}}" dx="-5" text-anchor="end" dy="4">{{.Label}}</text>
{{end}}{{range .XTicks}}<text class="lbl" x="{{.X}}" y="{{$.BusyChart.Base}}" dy="16" text-anchor="middle">{{.Label}}</text>
{{end}}<line class="axis" x1="{{.EndX}}" x2="{{.EndX}}" y1="{{.Top}}" y2="{{.Base}}"/><text class="lbl" x="{{.EndX}}" y="{{.Top}}" dy="-6" text-anchor="middle">sending ends</text>
{{range .Lines}}<polyline class="{{.Class}}" fill="none" stroke-width="2" points="{{.Points}}"/>
{{end}}{{range .Lines}}<rect class="k-{{.Class}}" x="{{$.BusyChart.Width}}" y="{{.LegendY}}" width="10" height="10" transform="translate(-180,-9)"/><text class="lbl" x="{{$.BusyChart.Width}}" y="{{.LegendY}}" transform="translate(-165,0)">{{.Label}}</text>
{{end}}</svg>{{end}}
<table>
<tr><th>volume scenario</th><th>mode</th><th>events sent</th><th>counted at Stripe</th><th>busy customer sent</th><th>counted when sending ended</th><th>counted later</th><th>quiet customers short when sending ended (events missing)</th><th>all counted</th><th>Stripe calls (refused)</th><th>entries unacknowledged</th>{{if .Report.Incomplete}}<th>status</th>{{end}}</tr>
{{range .Report.Busy}}<tr class="{{.Mode}}{{if .Failed}} failed{{end}}"><td>{{.Scenario}}</td><td>{{.Mode}}</td><td>{{.Produced}}</td><td>{{.Counted}}</td><td>{{.BusyProduced}}</td><td>{{.BusyAtEnd}}</td><td>{{.BusyAfter}} (+{{.AfterSeconds}}s)</td><td>{{.QuietShortAtEnd}} of {{.QuietCustomers}} ({{.QuietMissingAtEnd}})</td><td>{{caughtUp .}}</td><td>{{.StripeCalls}} ({{.Refused}})</td><td>{{.Backlog}}</td>{{if $.Report.Incomplete}}<td class="{{if .Failed}}bad{{else}}ok{{end}}">{{if .Failed}}FAILED: {{.Error}}{{else}}finished{{end}}</td>{{end}}</tr>
{{end}}</table>
<ul>{{range .Report.Busy}}{{if not .Failed}}<li><b>{{.Mode}}</b>: {{summary .}}</li>{{end}}{{end}}</ul>{{end}}`))
