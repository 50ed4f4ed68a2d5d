package alerts

import (
	"context"
	"sync"
)

// Memory is a Notifier that keeps alerts in memory, for the tests of the
// packages that send alerts.
type Memory struct {
	mu      sync.Mutex
	alerts  []Alert
	changed chan struct{}
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{changed: make(chan struct{})} }

// Notify records a.
func (m *Memory) Notify(a Alert) {
	m.mu.Lock()
	m.alerts = append(m.alerts, a)
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// Close does nothing.
func (m *Memory) Close(context.Context) error { return nil }

// Alerts returns a copy of what was notified, in order.
func (m *Memory) Alerts() []Alert {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Alert(nil), m.alerts...)
}

// Wait blocks until at least n alerts were notified or ctx ends, and
// returns them.
func (m *Memory) Wait(ctx context.Context, n int) ([]Alert, error) {
	for {
		m.mu.Lock()
		if len(m.alerts) >= n {
			out := append([]Alert(nil), m.alerts...)
			m.mu.Unlock()
			return out, nil
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
