package consumercli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/meterledger"
)

const meterCapDescription = `Meter spend caps bound how much of a meter one Stripe customer may be sent in a calendar month
(UTC, by the event's timestamp), in the meter's units: the sum of the values (--counts units, for
sum meters) or the number of events (--counts events, for count meters). A cap is checked and
counted in the same statement that reserves the event, so the fleet never passes it together.
An event that would pass it is not sent: it is dead-lettered with reason spend_cap and alerted;
raise the cap, then 'replay --stream S --reason spend_cap'. What counts: events sending, delivered
or parked (a refused one gives its units back), including those sent before the cap was set.

--customer '*' caps every customer of the meter without a cap of its own (each counted on its own);
--month '*' is every month. The most specific cap applies: the customer's before '*', then the
month's before '*'. A cap below what a customer already used stops its events until the cap is
raised or the month ends. Caps on meters that keep the last value are meaningless: leave them out.

  set     --meter M --customer C|'*' --month YYYY-MM|'*' --cap N [--counts units|events]
  show    [--meter M] [--in YYYY-MM]   caps, and what each customer used in the month (default: now)
  remove  --meter M --customer C|'*' --month YYYY-MM|'*'`

// MeterCapOptions are the flags of `consumer meter-cap set|show|remove`.
type MeterCapOptions struct {
	Verb        string
	DatabaseURL string
	Schema      string
	Meter       string
	Customer    string
	Month       string
	Cap         int64 // set: -1 is "not given"
	Counts      string
	In          string // show: the month whose use is shown; empty: the current one
}

func (o *MeterCapOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Meter, "meter", "", "the meter's event name (set, remove: required; show: only this meter)")
	fs.StringVar(&o.Customer, "customer", "", "Stripe customer id (cus_...), or '*' for every customer of the meter")
	fs.StringVar(&o.Month, "month", "", "YYYY-MM (UTC, by the event's timestamp), or '*' for every month")
	fs.Int64Var(&o.Cap, "cap", -1, "the cap, in the meter's units (or events with --counts events)")
	fs.StringVar(&o.Counts, "counts", string(meterledger.CountUnits), "what the cap bounds: units (the sum of the values) or events (their number)")
	fs.StringVar(&o.In, "in", "", "show: the month whose use is shown, YYYY-MM (default: the current month, UTC)")
}

// Validate checks the flags.
func (o *MeterCapOptions) Validate() error {
	switch o.Verb {
	case "set", "remove":
		if o.Meter == "" || o.Customer == "" || o.Month == "" {
			return cli.Usagef("--meter, --customer and --month are required ('*' for every customer or month)")
		}
		if err := meterledger.ValidMonth(o.Month); err != nil {
			return cli.Usagef("--month: %v", err)
		}
	case "show":
		if o.In != "" && (o.In == meterledger.AnyMonth || meterledger.ValidMonth(o.In) != nil) {
			return cli.Usagef("--in %q: want YYYY-MM", o.In)
		}
	}
	if o.Verb == "set" {
		if o.Cap < 0 {
			return cli.Usagef("--cap: a non-negative number of %s is required", o.Counts)
		}
		if c := meterledger.Counts(o.Counts); c != meterledger.CountUnits && c != meterledger.CountEvents {
			return cli.Usagef("--counts %q: want units or events", o.Counts)
		}
	}
	return nil
}

func meterCapCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " meter-cap"
	fs := cli.NewFlagSet(name, name+" set|show|remove [flags]", meterCapDescription, stderr)
	o := MeterCapOptions{Cap: -1}
	o.register(fs)
	verb, rest, err := cli.SplitVerb(fs, args, "set", "show", "remove")
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	o.Verb, name = verb, name+" "+verb
	return runCommand(ctx, name, fs, rest, &o, stdout, stderr)
}

func (o *MeterCapOptions) run(ctx context.Context, w io.Writer) error {
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := meterledger.New(pool, meterledger.Config{Schema: o.Schema})
	if err != nil {
		return err
	}
	month := meterledger.MonthOf(time.Now())
	switch o.Verb {
	case "set":
		c, err := l.SetCap(ctx, meterledger.Cap{EventName: o.Meter, StripeCustomerID: o.Customer, Month: o.Month,
			Cap: o.Cap, Counts: meterledger.Counts(o.Counts)})
		if err != nil {
			return err
		}
		if c.Month != meterledger.AnyMonth {
			month, _ = time.Parse("2006-01", c.Month)
		}
		return writeMeterCaps(ctx, w, l, c.EventName, month)
	case "remove":
		if err := l.RemoveCap(ctx, o.Meter, o.Customer, o.Month); err != nil {
			if errors.Is(err, meterledger.ErrNotFound) {
				return cli.Usagef("no %s cap for %s in %s (see `%s meter-cap show --meter %s`)", o.Meter, o.Customer, o.Month, prog, o.Meter)
			}
			return err
		}
		fmt.Fprintf(w, "removed the %s cap for %s in %s\n", o.Meter, o.Customer, o.Month)
		return nil
	}
	if o.In != "" {
		month, _ = time.Parse("2006-01", o.In)
	}
	return writeMeterCaps(ctx, w, l, o.Meter, month)
}

// writeMeterCaps prints the caps of meter (every meter's when empty) that
// apply in month, with what each bounds: a customer's use, or for a cap of
// every customer, how many customers it applies to and how many reached it.
// Caps of other months are listed after them, without use.
func writeMeterCaps(ctx context.Context, w io.Writer, l *meterledger.Ledger, meter string, month time.Time) error {
	inUse, err := l.CapsInUse(ctx, meter, month)
	if err != nil {
		return err
	}
	all, err := l.Caps(ctx, meter)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	m := month.Format("2006-01")
	fmt.Fprintf(tw, "METER\tCUSTOMER\tMONTH\tCAP\tIN %s\tUPDATED\n", m)
	for _, c := range inUse {
		use := fmt.Sprintf("%d used", c.Used)
		if c.StripeCustomerID == meterledger.AnyCustomer {
			use = fmt.Sprintf("%d customers, %d at the cap", c.Customers, c.Reached)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d %s\t%s\t%s\n", c.EventName, c.StripeCustomerID, c.Month, c.Cap.Cap, c.Counts, use,
			c.UpdatedAt.Format(time.RFC3339))
	}
	for _, c := range all {
		if c.Month != meterledger.AnyMonth && c.Month != m {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d %s\t-\t%s\n", c.EventName, c.StripeCustomerID, c.Month, c.Cap, c.Counts,
				c.UpdatedAt.Format(time.RFC3339))
		}
	}
	if len(all) == 0 {
		fmt.Fprintln(tw, "(no meter caps)")
	}
	return tw.Flush()
}
