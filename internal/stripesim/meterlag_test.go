package stripesim

import (
	"bytes"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestMeterSummaryLag: with Faults.MeterSummaryLag an event counts in the
// summaries only once received that long ago (Stripe's summaries are
// eventually consistent), while MeterTotal counts it at once; the lag is
// settable through POST /_sim/faults.
func TestMeterSummaryLag(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 5, 3, 12, 0, 0, 0, time.UTC)
	srv, sc := setup(t, Config{Now: now})
	m := newMeter(t, sc, "api_calls", FormulaSum)
	resp, err := http.Post(srv.URL()+"/_sim/faults", "application/json", bytes.NewReader([]byte(`{"meter_summary_lag":"10m"}`)))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("setting the lag: %v %v", err, resp)
	}
	resp.Body.Close()
	if got := srv.Faults().MeterSummaryLag; got != 10*time.Minute {
		t.Fatalf("lag = %s, want 10m", got)
	}
	hour := now.Add(-time.Hour)
	sendAt(t, sc, "api_calls", "cus_a", "5", "a", hour.Add(time.Minute))
	srv.Advance(5 * time.Minute)
	sendAt(t, sc, "api_calls", "cus_a", "7", "b", hour.Add(2*time.Minute))
	read := func() float64 {
		got := summaries(t, sc, m.ID, "cus_a", hour, now, "hour", 0)
		if len(got) == 0 {
			return 0
		}
		return got[0].value
	}
	if got := read(); got != 0 {
		t.Fatalf("5 minutes after the first event: summary %v, want 0 (lagging)", got)
	}
	if srv.MeterTotal("api_calls", "cus_a") != 12 {
		t.Fatal("MeterTotal must not lag")
	}
	srv.Advance(5 * time.Minute)
	if got := read(); got != 5 {
		t.Fatalf("10 minutes after the first event: summary %v, want 5", got)
	}
	srv.Advance(5 * time.Minute)
	if got := read(); got != 12 {
		t.Fatalf("after both lags: summary %v, want 12", got)
	}
}

// TestMeterSeed: POST /_sim/meter_seed records events without HTTP calls
// per event; an unknown meter is refused.
func TestMeterSeed(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	newMeter(t, sc, "api_calls", FormulaSum)
	body := `[{"event_name":"api_calls","customer":"cus_a","value":3,"timestamp":` + strconv.FormatInt(t0.Add(-time.Hour).Unix(), 10) +
		`},{"event_name":"api_calls","customer":"cus_a","value":4,"timestamp":` + strconv.FormatInt(t0.Add(-time.Hour).Unix(), 10) + `}]`
	resp, err := http.Post(srv.URL()+"/_sim/meter_seed", "application/json", bytes.NewReader([]byte(body)))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("seeding: %v %v", err, resp)
	}
	resp.Body.Close()
	if got := srv.MeterTotal("api_calls", "cus_a"); got != 7 {
		t.Fatalf("total %d, want 7", got)
	}
	resp, err = http.Post(srv.URL()+"/_sim/meter_seed", "application/json", bytes.NewReader([]byte(`[{"event_name":"nope","customer":"c","value":1}]`)))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an unknown meter was seeded: %v %v", err, resp)
	}
	resp.Body.Close()
}
