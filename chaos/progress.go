package chaos

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress writes the drill's progress line. On a terminal (rewrite) it
// redraws one line as the scenario advances; elsewhere (CI logs) it writes
// a line when a scenario starts and when it ends, so logs stay readable.
type progress struct {
	w       io.Writer
	rewrite bool

	mu     sync.Mutex
	label  string
	began  time.Time
	last   time.Time
	drawn  bool
	status string
}

func (p *progress) start(c *cell, n, total int) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = fmt.Sprintf("[%d/%d] %s / %s", n, total, c.scenario, c.mode)
	p.began = time.Now()
	p.status = "starting"
	if p.rewrite {
		p.draw()
	} else {
		fmt.Fprintf(p.w, "chaos: %s: running\n", p.label)
	}
}

func (p *progress) update(_ *cell, status string) {
	if p == nil || p.w == nil || !p.rewrite {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = status
	if time.Since(p.last) >= 100*time.Millisecond {
		p.draw()
	}
}

func (p *progress) draw() {
	fmt.Fprintf(p.w, "\r\033[Kchaos: %s: %s (%.1fs)", p.label, p.status, time.Since(p.began).Seconds())
	p.last, p.drawn = time.Now(), true
}

func (p *progress) finish(_ *cell, r Result) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rewrite {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "chaos: %s: %d events, %d charges, %d duplicate(s) (%s), %d flagged, %d refunded in %.1fs\n",
		p.label, r.Events, r.Charges, r.DuplicateCharges, Dollars(r.DuplicateCents), r.Flagged, r.Refunded, r.Elapsed.Seconds())
	p.drawn = false
}

// finishUsage writes a usage cell's result line.
func (p *progress) finishUsage(r UsageResult) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rewrite {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "chaos: %s: %d events, %d units expected, Stripe counts %d: %d over-counted in %d event(s), %d parked in %.1fs\n",
		p.label, r.Events, r.ExpectedUnits, r.StripeUnits, r.OverCountUnits, r.OverCountEvents, r.Parked, r.Elapsed.Seconds())
	p.drawn = false
}

// failLine writes a failure line for the current cell's label, or for
// label when one is given (a cell that could not even be set up).
func (p *progress) failLine(label string, elapsed time.Duration, why string) {
	if p == nil || p.w == nil {
		return
	}
	if label == "" {
		p.mu.Lock()
		label = p.label
		p.mu.Unlock()
	}
	p.note(fmt.Sprintf("%s: FAILED after %.1fs: %s", label, elapsed.Seconds(), why))
}

// fail writes a cell's failure line; c is nil when the cell could not even
// be set up.
func (p *progress) fail(c *cell, n, total int, r Result) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	label := p.label
	p.mu.Unlock()
	if c == nil {
		label = fmt.Sprintf("[%d/%d] %s / %s", n, total, r.Scenario, r.Mode)
	}
	p.note(fmt.Sprintf("%s: FAILED after %.1fs: %s", label, r.Elapsed.Seconds(), r.Error))
}

func (p *progress) note(msg string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	fmt.Fprintf(p.w, "chaos: %s\n", msg)
}

func (p *progress) done() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}
