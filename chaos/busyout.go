package chaos

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// busySenders says what sends on each side of usage-busy-customer.
var busySenders = map[string]string{
	ModeNaiveIdentifier: "two naive senders (one call per event, in stream order, the event id as identifier) and the XAUTOCLAIM monitor",
	ModePelguard:        "two pelguard meter consumers sending from the ledger (one call per customer and second) and the reaper",
}

// writeBusyTable writes usage-busy-customer's table and, under it, what
// its numbers mean, side by side.
func (r Report) writeBusyTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "volume scenario\tmode\tevents sent\tcounted at Stripe\tbusy customer sent\tcounted when sending ended\tcounted later\tquiet customers short when sending ended\tall counted\tStripe calls (refused)\tentries unacknowledged\t")
	for _, x := range r.Busy {
		mark := ""
		if x.Failed() {
			mark = "  FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d (+%gs)\t%d of %d\t%s\t%d (%d)\t%d\t%s\n", x.Scenario, x.Mode, x.Produced, x.Counted,
			x.BusyProduced, x.BusyAtEnd, x.BusyAfter, x.AfterSeconds, x.QuietShortAtEnd, x.QuietCustomers, caughtUp(x),
			x.StripeCalls, x.Refused, x.Backlog, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range r.Busy {
		if x.Failed() {
			continue
		}
		if _, err := fmt.Fprintf(w, "  %s: %s\n", x.Mode, busySummary(x)); err != nil {
			return err
		}
	}
	return nil
}

// caughtUp is the "all counted" cell: how long after sending ended, or
// that it was not within the bound.
func caughtUp(x BusyResult) string {
	if x.CaughtUp() {
		return fmt.Sprintf("after %.1fs", x.CaughtUpSeconds)
	}
	return fmt.Sprintf("not within %gs", x.BoundSeconds)
}

// busySummary says in plain words what a side's numbers mean for the
// invoices.
func busySummary(x BusyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s. ", busySenders[x.Mode])
	rate := float64(x.BusyProduced) / max(x.ProductionSeconds, 1e-9)
	behind := x.BusyProduced - int(x.BusyAtEnd)
	fmt.Fprintf(&b, "When sending ended after %.0fs, Stripe counted %d of the busy customer's %d events", x.ProductionSeconds, x.BusyAtEnd, x.BusyProduced)
	if behind > 0 && rate > 0 {
		fmt.Fprintf(&b, " (%.1fs of its usage behind)", float64(behind)/rate)
	}
	fmt.Fprintf(&b, ", and %d of the %d quiet customers were short. ", x.QuietShortAtEnd, x.QuietCustomers)
	if x.CaughtUp() {
		fmt.Fprintf(&b, "Every event was counted %.1fs later, each exactly once, in %d calls: an invoice closed then bills every customer in full.",
			x.CaughtUpSeconds, x.StripeCalls)
	} else {
		fmt.Fprintf(&b, "%gs later Stripe counted %d of %d events, %d of the quiet customers were still short and %d stream entries unacknowledged: "+
			"an invoice closed then under-bills, and the backlog grows for as long as the busy customer keeps sending.",
			x.BoundSeconds, x.Counted, x.Produced, x.QuietShortAtStop, x.Backlog)
	}
	if x.OverCounted > 0 {
		fmt.Fprintf(&b, " Stripe counted %d event(s) twice.", x.OverCounted)
	}
	return b.String()
}
