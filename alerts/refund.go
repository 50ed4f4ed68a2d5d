package alerts

import (
	"fmt"
	"sort"
	"strings"
)

// KindRefundSkipped is a refund run that left duplicates open.
const KindRefundSkipped Kind = "refund_skipped"

// SkippedRefund is one duplicate a refund run did not refund.
type SkippedRefund struct {
	FindingID   int64
	ChargeID    string
	AmountCents int64
	Currency    string
	// Code is the skip reason's stable name (canonical_refunded, max_cents_24h,
	// transient, …); Reason says it in words.
	Code   string
	Reason string
}

// RefundSkippedInput is what one refund run left open.
type RefundSkippedInput struct {
	Refunded      int
	RefundedCents int64
	Skipped       []SkippedRefund
}

// RefundSkipped tells what a refund run (`auditor refund`, --auto-refund)
// left open and why, counted by reason: a refused refund is a human's to
// look at (the canonical charge changed at Stripe), a capped or transient
// one is refunded by a later run.
func RefundSkipped(in RefundSkippedInput) Alert {
	byCode := map[string]int{}
	items := make([]Item, 0, len(in.Skipped))
	for _, s := range in.Skipped {
		byCode[s.Code]++
		items = append(items, Item{Text: fmt.Sprintf("finding %d %s %s: %s — %s", s.FindingID, code(s.ChargeID),
			Money(s.AmountCents, s.Currency), code(s.Code), Escape(s.Reason))})
	}
	codes := make([]string, 0, len(byCode))
	for c := range byCode {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	fields := make([]Field, 0, len(codes)+1)
	fields = append(fields, Field{Label: "Refunded", Value: fmt.Sprintf("%d (%d minor units)", in.Refunded, in.RefundedCents)})
	fp := []string{"refund_skipped"}
	for _, c := range codes {
		fields = append(fields, Field{Label: "Skipped: " + c, Value: fmt.Sprint(byCode[c])})
		fp = append(fp, fmt.Sprintf("%s=%d", c, byCode[c]))
	}
	return Alert{
		Kind:  KindRefundSkipped,
		Title: fmt.Sprintf("Refund run skipped %d duplicate(s)", len(in.Skipped)),
		Text: "Skipped duplicates stay open. Refused ones (the canonical charge was refunded, disputed or changed at Stripe, " +
			"or the ledger moved) need a person: see docs/operations/findings-and-refunds.md, Refund runs. Capped and transient ones are refunded by a later run.",
		Fields: fields, ItemsTitle: "Skipped", Items: items, InlineItems: 10,
		Fingerprint: strings.Join(fp, ":"),
	}
}
