package stripesim

import (
	"net/http"
	"slices"
	"sync"
	"time"
)

// Meter wraps a handler (a Server) and records when each /v1 request
// arrived and how many were answered 429: what a rate-limit test asserts
// ("never more than N requests in any second"). Serve it with
// httptest.NewServer(m) and point the clients at that URL.
type Meter struct {
	next http.Handler

	mu       sync.Mutex
	arrivals []time.Time
	limited  int64
}

// NewMeter wraps next.
func NewMeter(next http.Handler) *Meter { return &Meter{next: next} }

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// ServeHTTP records the request and passes it on.
func (m *Meter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Path) < 4 || r.URL.Path[:4] != "/v1/" {
		m.next.ServeHTTP(w, r)
		return
	}
	now := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	m.next.ServeHTTP(sw, r)
	m.mu.Lock()
	m.arrivals = append(m.arrivals, now)
	if sw.status == http.StatusTooManyRequests {
		m.limited++
	}
	m.mu.Unlock()
}

// MeterStats summarises the requests a Meter saw.
type MeterStats struct {
	Requests    int           // /v1 requests
	RateLimited int64         // of which answered 429
	Span        time.Duration // first to last arrival
	// MaxPerWindow is the most requests that arrived in any window of the
	// length given to Stats (a sliding window over the arrivals).
	MaxPerWindow int
}

// Stats summarises the arrivals since the last Reset; window sets
// MaxPerWindow's window (1 s when 0).
func (m *Meter) Stats(window time.Duration) MeterStats {
	if window <= 0 {
		window = time.Second
	}
	m.mu.Lock()
	arr := slices.Clone(m.arrivals)
	st := MeterStats{Requests: len(arr), RateLimited: m.limited}
	m.mu.Unlock()
	slices.SortFunc(arr, func(a, b time.Time) int { return a.Compare(b) })
	if len(arr) > 0 {
		st.Span = arr[len(arr)-1].Sub(arr[0])
	}
	j := 0
	for i := range arr {
		for arr[i].Sub(arr[j]) >= window {
			j++
		}
		st.MaxPerWindow = max(st.MaxPerWindow, i-j+1)
	}
	return st
}

// Between counts the arrivals in [from, to).
func (m *Meter) Between(from, to time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, a := range m.arrivals {
		if !a.Before(from) && a.Before(to) {
			n++
		}
	}
	return n
}

// Reset forgets every arrival.
func (m *Meter) Reset() {
	m.mu.Lock()
	m.arrivals, m.limited = nil, 0
	m.mu.Unlock()
}
