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
// The three modes of a usage scenario run at once: each cell keeps its own
// label, and the redrawn line shows the cell that moved last.
type progress struct {
	w       io.Writer
	rewrite bool

	mu     sync.Mutex
	labels map[*cell]string
	label  string // the drawn line's cell
	began  map[*cell]time.Time
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
	if p.labels == nil {
		p.labels, p.began = map[*cell]string{}, map[*cell]time.Time{}
	}
	p.labels[c] = fmt.Sprintf("[%d/%d] %s / %s", n, total, c.scenario, c.mode)
	p.began[c] = time.Now()
	p.label, p.status = p.labels[c], "starting"
	if p.rewrite {
		p.draw(c)
	} else {
		p.clear()
		fmt.Fprintf(p.w, "chaos: %s: running\n", p.labels[c])
	}
}

func (p *progress) update(c *cell, status string) {
	if p == nil || p.w == nil || !p.rewrite {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label, p.status = p.labels[c], status
	if time.Since(p.last) >= 100*time.Millisecond {
		p.draw(c)
	}
}

func (p *progress) draw(c *cell) {
	fmt.Fprintf(p.w, "\r\033[Kchaos: %s: %s (%.1fs)", p.label, p.status, time.Since(p.began[c]).Seconds())
	p.last, p.drawn = time.Now(), true
}

// clear erases a drawn line before a line of its own; callers hold mu.
func (p *progress) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// line writes a finished cell's line and forgets the cell.
func (p *progress) line(c *cell, text string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.w, "chaos: %s: %s\n", p.labels[c], text)
	delete(p.labels, c)
	delete(p.began, c)
}

func (p *progress) finish(c *cell, r Result) {
	p.line(c, fmt.Sprintf("%d events, %d charges, %d duplicate(s) (%s), %d flagged, %d refunded in %.1fs",
		r.Events, r.Charges, r.DuplicateCharges, Dollars(r.DuplicateCents), r.Flagged, r.Refunded, r.Elapsed.Seconds()))
}

// finishUsage writes a usage cell's result line.
func (p *progress) finishUsage(c *cell, r UsageResult) {
	p.line(c, fmt.Sprintf("%d events, %d units expected, Stripe counts %d: %d over-counted in %d event(s), %d parked in %.1fs",
		r.Events, r.ExpectedUnits, r.StripeUnits, r.OverCountUnits, r.OverCountEvents, r.Parked, r.Elapsed.Seconds()))
}

// finishBusy writes a busy-customer side's result line.
func (p *progress) finishBusy(c *cell, r BusyResult) {
	caught := fmt.Sprintf("not all counted %gs after production", r.BoundSeconds)
	if r.CaughtUp() {
		caught = fmt.Sprintf("all counted %.1fs after production", r.CaughtUpSeconds)
	}
	p.line(c, fmt.Sprintf("%d of %d events counted, %s, %d Stripe calls, in %.1fs",
		r.Counted, r.Produced, caught, r.StripeCalls, r.Elapsed.Seconds()))
}

// fail writes a cell's failure line; c is nil when the cell could not even
// be set up (then the label is made from n, total, scenario and mode).
func (p *progress) fail(c *cell, n, total int, scenario, mode string, elapsed time.Duration, why string) {
	if p == nil || p.w == nil {
		return
	}
	text := fmt.Sprintf("FAILED after %.1fs: %s", elapsed.Seconds(), why)
	if c == nil {
		p.note(fmt.Sprintf("[%d/%d] %s / %s: %s", n, total, scenario, mode, text))
		return
	}
	p.line(c, text)
}

func (p *progress) note(msg string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.w, "chaos: %s\n", msg)
}

func (p *progress) done() {
	if p == nil || p.w == nil || !p.rewrite {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
}
