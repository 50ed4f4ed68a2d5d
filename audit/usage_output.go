package audit

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes a usage run's report: what was compared, then the open
// findings, the resolved ones and the corrections.
func (r UsageReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "usage run #%d  days %s → %s, hours → %s\n", r.RunID, r.DailyFrom.Format(time.DateOnly),
		r.HourlyFrom.Format(time.DateOnly), r.To.Format(time.RFC3339))
	fmt.Fprintf(w, "compared %d windows of %d meter customers (%d meters) in %d summary requests in %s\n",
		r.WindowsCompared, r.Customers, len(r.Meters), r.Requests, r.Duration.Round(time.Millisecond))
	names := make([]string, 0, len(r.Skipped))
	for n := range r.Skipped {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "not compared: %s: %s\n", n, r.Skipped[n])
	}
	fmt.Fprintf(w, "usage findings: %d open, %d differences not yet stable, %d resolved by this run\n",
		r.OpenFindings, r.Suspect, len(r.Resolved))
	if len(r.Findings) > 0 {
		fmt.Fprintln(w)
		if err := WriteUsageFindings(w, r.Findings); err != nil {
			return err
		}
	}
	if len(r.Resolved) > 0 {
		fmt.Fprintln(w, "\nresolved by this run:")
		if err := WriteUsageFindings(w, r.Resolved); err != nil {
			return err
		}
	}
	if len(r.Corrections) > 0 {
		fmt.Fprintln(w, "\ncorrections:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FINDING\tKIND\tSTATUS\tUNITS\tEVENTS SENT\tIDENTIFIER\tNOTE")
		for _, c := range r.Corrections {
			status, note := c.Status, c.LastError
			if c.Skipped != "" {
				status, note = "skipped", c.Skipped
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\n", c.FindingID, c.Kind, status, c.Units, c.EventsSent, c.Identifier, note)
		}
		return tw.Flush()
	}
	return nil
}

// WriteUsageFindings writes usage findings as a table.
func WriteUsageFindings(w io.Writer, fs []UsageFinding) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSTATE\tNEW\tMETER\tCUSTOMER\tWINDOW\tLEDGER\tSTRIPE\tMEASURE\tNOTE")
	for _, f := range fs {
		newMark := ""
		if f.New {
			newMark = "new"
		}
		note := f.ManualAction
		if f.Resolution != "" {
			note = f.Resolution
		} else if f.Unknown != "" {
			note = strings.TrimSpace(note + " " + f.Unknown)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s/%s\t%d\t%d\t%s\t%s\n", f.ID, f.Kind, f.State, newMark, f.EventName,
			f.StripeCustomerID, f.WindowStart.Format("2006-01-02T15:04Z"), f.WindowEnd.Sub(f.WindowStart), f.LedgerValue,
			f.StripeValue, f.Measure, note)
	}
	return tw.Flush()
}
