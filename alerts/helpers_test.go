package alerts

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pelguard/pelguard/alerts/slacktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is the tests' time source. In auto mode every After fires at
// once and moves the clock forward, so backoffs and rate-limit waits cost
// nothing while Sleeps still shows what was waited for; otherwise After
// waits for Advance.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	auto    bool
	sleeps  []time.Duration
	waiters []fakeWaiter
	changed chan struct{}
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock(auto bool) *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), auto: auto, changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	ch := make(chan time.Time, 1)
	if c.auto {
		c.now = c.now.Add(d)
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), ch: ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves time and fires the waiters that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// WaitWaiters blocks until n goroutines wait on the clock.
func (c *fakeClock) WaitWaiters(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c.mu.Lock()
		have, ch := len(c.waiters), c.changed
		c.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("waiting for %d clock waiters, have %d", n, have)
		}
	}
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// syncBuffer collects log output from the worker goroutine safely.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// bundle is what setup gives a test.
type bundle struct {
	rec   *slacktest.Recorder
	clock *fakeClock
	reg   *prometheus.Registry
	logs  *syncBuffer
	cfg   Config
}

const testToken = "xoxb-1111-2222-testtoken"

// setup starts a recorder and returns a Config for mode "webhook" or "bot"
// with a fast, auto-advancing clock.
func setup(t *testing.T, mode string) *bundle {
	t.Helper()
	rec := slacktest.NewRecorder()
	t.Cleanup(rec.Close)
	b := &bundle{rec: rec, clock: newFakeClock(true), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	b.cfg = Config{
		MaxAttempts: 3,
		BaseBackoff: 100 * time.Millisecond,
		MaxBackoff:  time.Second,
		Logger:      slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock:       b.clock,
		Registerer:  b.reg,
	}
	switch mode {
	case "webhook":
		b.cfg.WebhookURL = rec.WebhookURL()
	case "bot":
		b.cfg.BotToken, b.cfg.Channel, b.cfg.APIURL = testToken, "C0TEST", rec.APIURL()
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	return b
}

// start builds the notifier and closes it at the end of the test.
func (b *bundle) start(t *testing.T) *Slack {
	t.Helper()
	n, err := New(b.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s, ok := n.(*Slack)
	if !ok {
		t.Fatalf("New returned %T, want *Slack", n)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// counter reads one labelled counter from the registry.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

var modes = []string{"webhook", "bot"}
