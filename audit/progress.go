package audit

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// startProgress writes "charges scanned, rate, pages" to cfg.Progress every
// ProgressInterval until the returned stop is called. Only a terminal gets
// this (the caller decides); logs carry the totals at the end.
func (a *Auditor) startProgress(c *collector, pages *atomic.Int64, pagesBefore int64) (stop func()) {
	w := a.cfg.Progress
	if w == nil {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func(final bool) {
		n := c.scanned.Load()
		el := time.Since(start).Seconds()
		rate := 0.0
		if el > 0 {
			rate = float64(n) / el
		}
		end := ""
		if final {
			end = "\n"
		}
		fmt.Fprintf(w, "\r\033[Kscanned %d charges (%.0f/s), %d pages, %d pelguard, %d legacy%s",
			n, rate, pages.Load()-pagesBefore, c.pelguardN.Load(), c.legacyN.Load(), end)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(a.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				line(true)
				return
			case <-t.C:
				line(false)
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
