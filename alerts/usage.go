package alerts

import (
	"fmt"
	"strconv"
	"time"
)

// KindUsageDrift: the auditor's usage reconciliation found a meter whose
// total at Stripe differs from what the ledger delivered for a customer and
// window (usage_over, usage_under), stable over its re-checks, or made or
// could not make a correction.
const KindUsageDrift Kind = "usage_drift"

// UsageFindingInfo is one usage finding as the alert shows it.
type UsageFindingInfo struct {
	ID           int64
	Kind         string // usage_over, usage_under
	EventName    string
	Customer     string
	WindowStart  time.Time
	WindowEnd    time.Time
	LedgerValue  int64
	StripeValue  int64
	Correction   string // what was done about it, or the manual action
	ManualAction bool
}

// UsageDrift is the reconciliation's one message per run with its new
// usage findings and its corrections.
func UsageDrift(runID int64, findings []UsageFindingInfo, corrected, manual int) Alert {
	items := make([]Item, 0, len(findings))
	for _, f := range findings {
		line := fmt.Sprintf("#%d %s %s of %s, %s–%s: ledger %d, Stripe %d",
			f.ID, code(f.Kind), code(f.EventName), code(f.Customer),
			f.WindowStart.UTC().Format("2006-01-02 15:04"), f.WindowEnd.UTC().Format("15:04 MST"), f.LedgerValue, f.StripeValue)
		if f.Correction != "" {
			prefix := "corrected: "
			if f.ManualAction {
				prefix = "*a person must:* "
			}
			line += "\n    " + prefix + Escape(f.Correction)
		}
		items = append(items, Item{Text: line})
	}
	return Alert{
		Kind:  KindUsageDrift,
		Title: fmt.Sprintf("pelguard usage run #%d: %d meter window%s differ from the ledger", runID, len(findings), plural(len(findings))),
		Text: "Stripe's meter totals (event summaries) differ from what pelguard delivered, and the difference held over the " +
			"re-checks. usage_over: Stripe counts more (another sender, a re-send past the identifier window); usage_under: " +
			"Stripe counts less (an event dropped after its 200).",
		Fields: []Field{
			{Label: "Corrections made", Value: strconv.Itoa(corrected)},
			{Label: "Need a person", Value: strconv.Itoa(manual)},
		},
		ItemsTitle:  "Windows",
		Items:       items,
		InlineItems: 10,
		// A reply per window, but not thousands of them: past 50 the
		// message counts the rest and usage-findings lists them.
		ThreadItems: len(items) <= 50,
		Fingerprint: "usage_drift:" + strconv.FormatInt(runID, 10),
	}
}
