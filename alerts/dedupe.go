package alerts

import (
	"log/slog"
	"sync"
	"time"
)

// dedupe remembers fingerprints for a TTL so a flapping condition produces
// one message per TTL instead of one per occurrence.
type dedupe struct {
	ttl  time.Duration
	mu   sync.Mutex
	seen map[string]time.Time // fingerprint → expiry
}

func newDedupe(ttl time.Duration) *dedupe {
	return &dedupe{ttl: ttl, seen: map[string]time.Time{}}
}

// claim reports whether fp may be sent now, and if so remembers it.
func (d *dedupe) claim(fp string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if exp, ok := d.seen[fp]; ok && now.Before(exp) {
		return false
	}
	// Prune lazily so the map stays bounded by what one TTL can hold,
	// without a goroutine of its own.
	if len(d.seen) >= 1024 {
		for k, exp := range d.seen {
			if !now.Before(exp) {
				delete(d.seen, k)
			}
		}
	}
	d.seen[fp] = now.Add(d.ttl)
	return true
}

// forget lets fp through again: its alert was never delivered.
func (d *dedupe) forget(fp string) {
	d.mu.Lock()
	delete(d.seen, fp)
	d.mu.Unlock()
}

// dropLogger logs dropped alerts at most once a second: a Slack outage
// during a storm must not turn every Notify into a log write.
type dropLogger struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *dropLogger) log(logger *slog.Logger, now time.Time, a Alert, reason string) {
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	logger.Warn("alerts: alert dropped", slog.String("reason", reason), slog.String("kind", string(a.Kind)),
		slog.String("title", Redact(a.Title)), slog.Int("dropped_without_log", suppressed))
}
