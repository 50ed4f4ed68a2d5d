package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// Usage of unknown outcome. An event whose call may or may not have reached
// Stripe (sending: in flight or its reply lost, alone or in an aggregate;
// parked: past the safe window; failed after such an attempt), or that was
// queued and not sent when the ledger was read (a sender may send it before
// Stripe's summary is read), is neither delivered nor nothing:
// the ledger side of a window is the interval [delivered + the negative
// values of those events, delivered + their positive values] (for a count
// meter, [delivered, delivered + their number]), widened by the units of
// the window's corrections not confirmed yet. A difference exists only
// outside it, and only the part outside it is corrected: a correction never
// takes back units that may be pelguard's own, and never re-sends units
// Stripe may already count. The finding names the events so that a person
// can check them at Stripe and settle each parked one (`pelguard-consumer
// meter-settle`), after which the window is compared exactly again.

// unknownNoteEvents is how many events of unknown outcome a finding names.
const unknownNoteEvents = 10

// unknownNote names what makes w's interval wide and what to check.
func (a *Auditor) unknownNote(ctx context.Context, eventName, customer string, w stagedWindow) (string, error) {
	var b strings.Builder
	if w.unknownEvents > 0 {
		evs, total, err := a.meters.UnknownInWindow(ctx, eventName, customer, w.start, w.end, unknownNoteEvents)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%d event(s) of this window were not sent yet or may or may not have reached Stripe, and are left as they are (values %+d to %+d): ",
			total, w.unknownLow, w.unknownHigh)
		queued := false
		for i, e := range evs {
			if i > 0 {
				b.WriteString("; ")
			}
			if e.Status == meterledger.StatusQueued {
				queued = true
				fmt.Fprintf(&b, "queued (recorded, not sent yet) %s value %d", e.Identifier, e.Value)
				continue
			}
			fmt.Fprintf(&b, "%s %s value %d first sent %s", e.Status, e.Identifier, e.Value, e.FirstSentAt.Format(time.RFC3339))
		}
		if total > len(evs) {
			fmt.Fprintf(&b, "; and %d more", total-len(evs))
		}
		b.WriteString(". Check each at Stripe (the meter's events of the customer, by identifier); a sending one is sent again " +
			"by the consumer while Stripe guards its identifier; settle a parked one with `pelguard-consumer meter-settle " +
			"--identifier ID --event-ts TS --counted|--not-counted --reason WHY`. Never send one again by hand.")
		if queued {
			b.WriteString(" A queued one is sent by the consumers from the ledger: nothing to do unless it stays queued.")
		}
		for _, e := range evs {
			if e.Status == meterledger.StatusFailed {
				b.WriteString(" A failed one was refused after an earlier attempt of unknown outcome: settle it the same way.")
				break
			}
		}
	}
	if w.correctionLow != 0 || w.correctionHigh != 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "Corrections of this window not confirmed sent may add %+d to %+d units: each is carried out, or handed to a person, by the next `pelguard-auditor usage` run.",
			w.correctionLow, w.correctionHigh)
	}
	return b.String(), nil
}
