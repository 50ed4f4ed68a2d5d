package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes a run's report as a readable table: a header with the
// window and counts, then one line per detected finding.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "audit run #%d  window %s → %s", r.RunID, r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	if r.Period != "" {
		fmt.Fprintf(w, "  period %s", r.Period)
	}
	if r.Legacy {
		fmt.Fprint(w, "  (legacy charges included)")
	}
	fmt.Fprintf(w, "\nscanned %d charges in %d pages (%d pelguard, %d legacy) against %d charged ledger rows in %s\n",
		r.ChargesScanned, r.Pages, r.PelguardCharges, r.LegacyCharges, r.LedgerCharged, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "findings: %d detected, %d new, %d open, %d resolved by this run\n", len(r.Findings), r.NewFindings,
		r.OpenFindings, len(r.Resolved))
	if len(r.Findings) > 0 {
		fmt.Fprintln(w)
		if err := WriteFindings(w, r.Findings); err != nil {
			return err
		}
	}
	if len(r.Resolved) > 0 {
		fmt.Fprintln(w, "\nresolved by this run:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tSUBJECT\tRESOLUTION")
		for _, f := range r.Resolved {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", f.ID, f.Kind, f.Subject, f.Resolution)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if r.Refund != nil {
		fmt.Fprintln(w)
		return r.Refund.WriteTable(w)
	}
	return nil
}

// WriteFindings writes findings as a table.
func WriteFindings(w io.Writer, fs []Finding) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSTATE\tNEW\tCUSTOMER\tPERIOD\tCHARGE\tCANONICAL\tAMOUNT\tDETAIL")
	for _, f := range fs {
		newMark := ""
		if f.New {
			newMark = "new"
		}
		kind := string(f.Kind)
		if f.Legacy {
			kind += " (legacy)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.ID, kind, f.State, newMark,
			dash(cmpStr(f.CustomerID, f.StripeCustomerID)), dash(f.BillingPeriod), dash(f.ChargeID),
			dash(f.CanonicalChargeID), money(f.AmountCents, f.Currency), f.Detail)
	}
	return tw.Flush()
}

// WriteTable writes a refund run's report.
func (r RefundReport) WriteTable(w io.Writer) error {
	verb := "refunded"
	if r.DryRun {
		verb = "would refund (dry run)"
	}
	fmt.Fprintf(w, "%s %d duplicate charge(s), %s in total\n", verb, len(r.Refunded), money(r.RefundedCents, ""))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.Refunded)+len(r.Skipped) > 0 {
		fmt.Fprintln(tw, "FINDING\tCHARGE\tCANONICAL (kept)\tAMOUNT\tREFUND\tNOTE")
	}
	for _, x := range r.Refunded {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", x.FindingID, x.ChargeID, x.CanonicalChargeID, money(x.AmountCents, x.Currency), dash(x.RefundID))
	}
	for _, x := range r.Skipped {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t-\tskipped (%s): %s\n", x.FindingID, x.ChargeID, x.CanonicalChargeID, money(x.AmountCents, x.Currency), x.SkipCode, x.Skipped)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.StoppedBy != "" {
		fmt.Fprintf(w, "caps left %d duplicate(s) open (first: --%s); a later run refunds them, or raise the cap\n", r.Remaining, r.StoppedBy)
	}
	if r.Rolling.MaxRefunds > 0 {
		fmt.Fprintf(w, "last 24 h: %d of %d refunds, %s of %s (--max-refunds-24h, --max-cents-24h)\n", r.Rolling.Refunds,
			r.Rolling.MaxRefunds, money(r.Rolling.Cents, ""), money(r.Rolling.MaxCents, ""))
	}
	return nil
}

// WriteJSON writes v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func money(cents int64, currency string) string {
	if cents == 0 && currency == "" {
		return "-"
	}
	cur := strings.ToUpper(currency)
	if cur == "" {
		cur = "(minor units)"
		return fmt.Sprintf("%d %s", cents, cur)
	}
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, cur)
}
