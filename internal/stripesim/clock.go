package stripesim

import (
	"sync"
	"time"
)

// clock is the emulator's time source. Frozen clocks (Config.Now set) only
// move through Advance/Set, so tests control `created` and the idempotency
// window exactly; otherwise it is wall time plus an offset.
type clock struct {
	mu     sync.Mutex
	frozen bool
	now    time.Time     // when frozen
	offset time.Duration // when following wall time
}

func newClock(start time.Time) *clock {
	if start.IsZero() {
		return &clock{}
	}
	return &clock{frozen: true, now: start}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		return c.now
	}
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		c.now = c.now.Add(d)
	} else {
		c.offset += d
	}
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frozen {
		c.now = t
	} else {
		c.offset = time.Until(t)
	}
}
