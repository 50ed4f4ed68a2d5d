package console

import (
	"context"
	"fmt"
	"html/template"
	"maps"
	"math"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

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

// The hour of a row is counted from $1 in seconds, so the session's time
// zone plays no part; $2 ends the range. The final failures are those of
// the latest periods ($3) alone: they are read through
// billing_records_period_status_idx, since an index on updated_at would
// cost every ledger update its HOT update.
const (
	qChargedByHour = `SELECT floor(extract(epoch FROM charged_at - $1) / 3600)::int, 'charged', count(*)
		FROM {schema}.billing_records WHERE status = 'charged' AND charged_at >= $1 AND charged_at < $2 GROUP BY 1`
	qFailedByHour = `SELECT floor(extract(epoch FROM updated_at - $1) / 3600)::int, status, count(*)
		FROM {schema}.billing_records WHERE billing_period = ANY($3) AND status IN ('declined', 'failed', 'action_required')
		AND updated_at >= $1 AND updated_at < $2 GROUP BY 1, 2`
	qOpenedByHour = `SELECT floor(extract(epoch FROM created_at - $1) / 3600)::int, 'opened', count(*)
		FROM {schema}.audit_findings WHERE created_at >= $1 AND created_at < $2 GROUP BY 1`
	qClosedByHour = `SELECT floor(extract(epoch FROM updated_at - $1) / 3600)::int, 'closed', count(*)
		FROM {schema}.audit_findings WHERE state <> 'open' AND updated_at >= $1 AND updated_at < $2 GROUP BY 1`
)

// chartPeriods is how many of the latest billing periods the failures
// chart reads.
const chartPeriods = 2

// hourSettle is how long after an hour ends its count is taken as final
// (commits in flight at its end have landed).
const hourSettle = 5 * time.Minute

// hourCache keeps the counts of the hours that are over: a refresh counts
// the current hour alone (at most a 24th of the day's rows), and an hour
// is counted once more after it settled. Each process keeps its own.
type hourCache struct {
	mu    sync.Mutex
	hours map[string]map[time.Time]cachedHour // by query
}

type cachedHour struct {
	counts map[string]float64
	at     time.Time // when counted
}

// counts returns sql's counts by series for the chartHours hours from
// start: cached hours that had settled when counted, the rest read in one
// query from the first hour missing.
func (c *hourCache) counts(ctx context.Context, db pg.DB, sql string, start, now time.Time, args ...any) (map[string][]float64, error) {
	c.mu.Lock()
	if c.hours == nil {
		c.hours = map[string]map[time.Time]cachedHour{}
	}
	key := sql + fmt.Sprint(args...)
	cached := c.hours[key]
	if cached == nil {
		cached = map[time.Time]cachedHour{}
		c.hours[key] = cached
	}
	cur := start.Add((chartHours - 1) * time.Hour)
	from := cur
	for h := start; h.Before(cur); h = h.Add(time.Hour) {
		if ch, ok := cached[h]; !ok || ch.at.Before(h.Add(time.Hour+hourSettle)) {
			from = h
			break
		}
	}
	c.mu.Unlock()
	read := map[time.Time]map[string]float64{}
	rows, err := db.Query(ctx, sql, append([]any{from, cur.Add(time.Hour)}, args...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var off int
		var name string
		var n int64
		if err := rows.Scan(&off, &name, &n); err != nil {
			return nil, err
		}
		h := from.Add(time.Duration(off) * time.Hour)
		if read[h] == nil {
			read[h] = map[string]float64{}
		}
		read[h][name] += float64(n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for h := from; h.Before(cur); h = h.Add(time.Hour) {
		cached[h] = cachedHour{counts: read[h], at: now}
	}
	for h := range cached {
		if h.Before(start) {
			delete(cached, h)
		}
	}
	out := map[string][]float64{}
	add := func(i int, counts map[string]float64) {
		for name, n := range counts {
			if out[name] == nil {
				out[name] = make([]float64, chartHours)
			}
			out[name][i] += n
		}
	}
	for i := range chartHours {
		h := start.Add(time.Duration(i) * time.Hour)
		if h.Before(from) {
			add(i, cached[h].counts)
		} else {
			add(i, read[h])
		}
	}
	return out, nil
}

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

// charts counts and draws the overview's charts; periods are the latest
// billing periods, newest first.
func (s *Server) charts(ctx context.Context, periods []string) ([]chart, error) {
	now := s.now()
	start := now.Truncate(time.Hour).Add(-(chartHours - 1) * time.Hour)
	latest := periods[:min(len(periods), chartPeriods)]
	qs := []struct {
		sql  string
		args []any
	}{{qChargedByHour, nil}, {qFailedByHour, []any{latest}}, {qOpenedByHour, nil}, {qClosedByHour, nil}}
	got := make([]map[string][]float64, len(qs))
	g, ctx := errgroup.WithContext(ctx)
	for i, q := range qs {
		g.Go(func() (err error) {
			got[i], err = s.hours.counts(ctx, s.db, q.sql, start, now, q.args...)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("counting rows per hour for the charts: %w", err)
	}
	billing, findings := got[0], got[2]
	maps.Copy(billing, got[1])
	maps.Copy(findings, got[3])
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
