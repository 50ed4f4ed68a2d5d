package reapercli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pelguard/pelguard/reaper"
)

// decisionPrinter writes decisions as they are made: from several
// goroutines, so behind a lock, and line by line so a long pass streams.
type decisionPrinter struct {
	mu     sync.Mutex
	w      io.Writer
	json   bool
	header bool
}

func newDecisionPrinter(w io.Writer, asJSON bool) *decisionPrinter {
	return &decisionPrinter{w: w, json: asJSON}
}

const rowFormat = "%-8s  %-24s  %-20s  %-24s  %9s  %5s  %-15s  %-24s  %s\n"

func (p *decisionPrinter) print(d reaper.Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		b, _ := json.Marshal(d) // plain struct: cannot fail
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	if !p.header {
		fmt.Fprintf(p.w, rowFormat, "TIME", "STREAM", "ID", "CONSUMER", "IDLE", "DELIV", "DECISION", "KEY", "DETAIL")
		p.header = true
	}
	detail := d.Reason
	if d.Outcome != "" {
		detail = strings.TrimSpace("outcome=" + string(d.Outcome) + " " + detail)
	}
	if d.Error != "" {
		detail = strings.TrimSpace(detail + " error=" + d.Error)
	}
	fmt.Fprintf(p.w, rowFormat, d.Time.UTC().Format("15:04:05"), d.Stream, d.ID, d.Consumer,
		d.Idle.Round(time.Millisecond), fmt.Sprint(d.Deliveries), d.Kind, d.Key, detail)
}

func (p *decisionPrinter) summary(s reaper.PassSummary) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kinds := make([]string, 0, len(s.Decisions))
	for k, n := range s.Decisions {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(kinds)
	fmt.Fprintf(p.w, "\n%d pending entries idle past --min-idle; would decide: %s (dry run: nothing changed)\n",
		s.Scanned, strings.Join(kinds, " "))
}
