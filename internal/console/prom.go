package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"time"
)

// The fleet's Stripe limiter lives in each process's metrics
// (pelguard_stripe_limiter_*, by role); with --prometheus-url the overview
// asks Prometheus for the fleet's sums.

// promTimeout bounds each query: the overview must not wait on a slow
// Prometheus.
const promTimeout = 2 * time.Second

// limiterRow is one role's figures over the last five minutes (429s over
// the last hour).
type limiterRow struct {
	Role        string
	Rate        float64 // requests/s
	Delayed     float64 // requests/s that waited
	WaitP99     float64 // seconds
	Limited1h   float64 // 429 answers
	FallbackNow float64 // requests/s paced without Redis
}

var limiterQueries = []struct {
	field func(*limiterRow) *float64
	q     string
}{
	{func(r *limiterRow) *float64 { return &r.Rate }, `sum by (role) (rate(pelguard_stripe_limiter_requests_total[5m]))`},
	{func(r *limiterRow) *float64 { return &r.Delayed }, `sum by (role) (rate(pelguard_stripe_limiter_requests_total{result="delayed"}[5m]))`},
	{func(r *limiterRow) *float64 { return &r.WaitP99 }, `histogram_quantile(0.99, sum by (role, le) (rate(pelguard_stripe_limiter_wait_seconds_bucket[5m])))`},
	{func(r *limiterRow) *float64 { return &r.Limited1h }, `sum by (role) (increase(pelguard_stripe_limiter_rate_limited_total[1h]))`},
	{func(r *limiterRow) *float64 { return &r.FallbackNow }, `sum by (role) (rate(pelguard_stripe_limiter_fallback_requests_total[5m]))`},
}

// limiter asks Prometheus for the limiter's figures by role, the queries
// at once.
func (s *Server) limiter(ctx context.Context) ([]limiterRow, error) {
	ctx, cancel := context.WithTimeout(ctx, promTimeout)
	defer cancel()
	results := make([]map[string]float64, len(limiterQueries))
	errs := make([]error, len(limiterQueries))
	var wg sync.WaitGroup
	for i, lq := range limiterQueries {
		wg.Go(func() { results[i], errs[i] = s.promQuery(ctx, lq.q) })
	}
	wg.Wait()
	byRole := map[string]*limiterRow{}
	for i, lq := range limiterQueries {
		for role, v := range results[i] {
			r := byRole[role]
			if r == nil {
				r = &limiterRow{Role: role}
				byRole[role] = r
			}
			*lq.field(r) = v
		}
	}
	out := make([]limiterRow, 0, len(byRole))
	for _, r := range byRole {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Role < out[j].Role })
	return out, errors.Join(errs...)
}

// promQuery runs an instant query and returns its vector by the role
// label.
func (s *Server) promQuery(ctx context.Context, q string) (map[string]float64, error) {
	var result []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	if err := s.promAPI(ctx, "query", url.Values{"query": {q}}, &result); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, r := range result {
		str, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil || v != v { // NaN: a quantile of no requests
			continue
		}
		out[r.Metric["role"]] = v
	}
	return out, nil
}

// promAPI calls Prometheus' HTTP API endpoint (query, query_range) with
// params and decodes the answer's data.result into result.
func (s *Server) promAPI(ctx context.Context, endpoint string, params url.Values, result any) error {
	u := s.cfg.PrometheusURL + "/api/v1/" + endpoint + "?" + params.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("asking Prometheus: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&body); err != nil {
		return fmt.Errorf("Prometheus answered %s: %w", resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("Prometheus answered %s: %s", resp.Status, body.Error)
	}
	if err := json.Unmarshal(body.Data.Result, result); err != nil {
		return fmt.Errorf("Prometheus answered %s: %w", resp.Status, err)
	}
	return nil
}

// limiterHistoryQueries are the limiter chart's series: per hour, summed
// over the fleet.
var limiterHistoryQueries = []struct{ name, q string }{
	{"429s", `sum(increase(pelguard_stripe_limiter_rate_limited_total[1h]))`},
	{"waited", `sum(increase(pelguard_stripe_limiter_requests_total{result="delayed"}[1h]))`},
}

// limiterChart asks Prometheus for the last day's 429s and waited requests
// per hour (each value taken at the end of its hour) and draws them.
func (s *Server) limiterChart(ctx context.Context, start time.Time) (chart, error) {
	ctx, cancel := context.WithTimeout(ctx, promTimeout)
	defer cancel()
	data := map[string][]float64{}
	var mu sync.Mutex
	errs := make([]error, len(limiterHistoryQueries))
	var wg sync.WaitGroup
	for i, lq := range limiterHistoryQueries {
		wg.Go(func() {
			vals, err := s.promRange(ctx, lq.q, start.Add(time.Hour), start.Add(chartHours*time.Hour))
			if err != nil {
				errs[i] = err
				return
			}
			series := make([]float64, chartHours)
			for ts, v := range vals {
				if h := int(ts.Sub(start)/time.Hour) - 1; h >= 0 && h < chartHours {
					series[h] += v
				}
			}
			mu.Lock()
			data[lq.name] = series
			mu.Unlock()
		})
	}
	wg.Wait()
	names := make([]string, len(limiterHistoryQueries))
	for i, lq := range limiterHistoryQueries {
		names[i] = lq.name
	}
	return renderChart("Stripe: 429s and waited requests per hour (Prometheus)", start, data, names), errors.Join(errs...)
}

// promRange runs a range query with an hour's step and returns its first
// series' values by time (a sum without labels has one).
func (s *Server) promRange(ctx context.Context, q string, from, to time.Time) (map[time.Time]float64, error) {
	var result []struct {
		Values [][2]any `json:"values"`
	}
	params := url.Values{"query": {q}, "start": {strconv.FormatInt(from.Unix(), 10)},
		"end": {strconv.FormatInt(to.Unix(), 10)}, "step": {"3600"}}
	if err := s.promAPI(ctx, "query_range", params, &result); err != nil {
		return nil, err
	}
	out := map[time.Time]float64{}
	if len(result) == 0 {
		return out, nil
	}
	for _, p := range result[0].Values {
		ts, _ := p[0].(float64)
		str, _ := p[1].(string)
		if v, err := strconv.ParseFloat(str, 64); err == nil && v == v {
			out[time.Unix(int64(ts), 0)] = v
		}
	}
	return out, nil
}
