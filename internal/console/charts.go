package console

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/pelguard/pelguard/internal/pg"
)

// Charts: server-rendered SVG (no script, no external asset; the colours
// are classes in style.css, since the CSP allows no inline style), hourly
// over the last day, counted from the ledger and the findings through
// indexes on their time columns (migration 00018).

const (
	chartHours = 24
	chartW     = 600
	chartH     = 150
	chartPad   = 28
)

// hourly counts rows per hour since start, by series name: the query
// returns (hour index, series, count).
func hourly(ctx context.Context, db pg.DB, q string, start time.Time, into map[string][]float64) error {
	rows, err := db.Query(ctx, q, start)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var h int
		var name string
		var n int64
		if err := rows.Scan(&h, &name, &n); err != nil {
			return err
		}
		if h < 0 || h >= chartHours {
			continue
		}
		if into[name] == nil {
			into[name] = make([]float64, chartHours)
		}
		into[name][h] += float64(n)
	}
	return rows.Err()
}

// The hour of a row is counted from $1 in seconds, so the session's time
// zone plays no part.
const (
	qChargedByHour = `SELECT floor(extract(epoch FROM charged_at - $1) / 3600)::int, 'charged', count(*)
		FROM {schema}.billing_records WHERE status = 'charged' AND charged_at >= $1 GROUP BY 1`
	qFailedByHour = `SELECT floor(extract(epoch FROM updated_at - $1) / 3600)::int, status, count(*)
		FROM {schema}.billing_records WHERE status IN ('declined', 'failed', 'action_required') AND updated_at >= $1 GROUP BY 1, 2`
	qOpenedByHour = `SELECT floor(extract(epoch FROM created_at - $1) / 3600)::int, 'opened', count(*)
		FROM {schema}.audit_findings WHERE created_at >= $1 GROUP BY 1`
	qClosedByHour = `SELECT floor(extract(epoch FROM updated_at - $1) / 3600)::int, 'closed', count(*)
		FROM {schema}.audit_findings WHERE state <> 'open' AND updated_at >= $1 GROUP BY 1`
)

// chart is one rendered chart.
type chart struct {
	Title string
	SVG   template.HTML
	Total []seriesTotal
}

type seriesTotal struct {
	Name string
	N    int64
}

func (s *Server) charts(ctx context.Context) ([]chart, error) {
	start := s.now().Truncate(time.Hour).Add(-(chartHours - 1) * time.Hour)
	billing, findings := map[string][]float64{}, map[string][]float64{}
	for _, q := range []struct {
		sql  string
		into map[string][]float64
	}{{qChargedByHour, billing}, {qFailedByHour, billing}, {qOpenedByHour, findings}, {qClosedByHour, findings}} {
		if err := hourly(ctx, s.db, q.sql, start, q.into); err != nil {
			return nil, fmt.Errorf("counting rows per hour for the charts: %w", err)
		}
	}
	return []chart{
		renderChart("Billing outcomes per hour (ledger)", start, billing, []string{"charged", "declined", "failed", "action_required"}),
		renderChart("Findings opened and closed per hour", start, findings, []string{"opened", "closed"}),
	}, nil
}

// renderChart draws series (in order; absent ones count zero) as lines
// over chartHours hours from start.
func renderChart(title string, start time.Time, data map[string][]float64, order []string) chart {
	c := chart{Title: title}
	top := 0.0
	for _, name := range order {
		var n int64
		for _, v := range data[name] {
			top = math.Max(top, v)
			n += int64(v)
		}
		c.Total = append(c.Total, seriesTotal{name, n})
	}
	top = niceCeil(top)
	x := func(h int) float64 { return chartPad + float64(h)*float64(chartW-chartPad-8)/float64(chartHours-1) }
	y := func(v float64) float64 { return float64(chartH-18) - v/top*float64(chartH-18-8) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s">`, chartW, chartH, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, chartPad, y(0), chartW-8, y(0))
	fmt.Fprintf(&b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, chartPad, y(top), chartW-8, y(top))
	fmt.Fprintf(&b, `<text class="lbl" x="%d" y="%.1f" text-anchor="end">%s</text>`, chartPad-4, y(top)+4, fmtCount(top))
	fmt.Fprintf(&b, `<text class="lbl" x="%d" y="%.1f" text-anchor="end">0</text>`, chartPad-4, y(0)+4)
	for h := 0; h < chartHours; h += 6 {
		fmt.Fprintf(&b, `<text class="lbl" x="%.1f" y="%d" text-anchor="middle">%s</text>`, x(h), chartH-4, start.Add(time.Duration(h)*time.Hour).UTC().Format("15:04"))
	}
	for i, name := range order {
		pts := data[name]
		var p strings.Builder
		for h := range chartHours {
			v := 0.0
			if pts != nil {
				v = pts[h]
			}
			fmt.Fprintf(&p, "%.1f,%.1f ", x(h), y(v))
		}
		fmt.Fprintf(&b, `<polyline class="s s%d s-%s" points="%s"><title>%s</title></polyline>`, i, name, strings.TrimSpace(p.String()), name)
	}
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String()) // every text in it is ours or escaped above
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func fmtCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
