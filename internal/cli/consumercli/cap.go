package consumercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
)

const capDescription = `Spend caps bound what may be charged per billing period (a 'vault key', e.g. 110% of
the expected total). An event that would pass the cap is dead-lettered with reason spend_cap and
can be replayed after the cap is raised.`

// CapOptions are the flags of `consumer cap set|show`.
type CapOptions struct {
	Verb        string // "set" or "show"
	DatabaseURL string
	Schema      string
	Period      string // set: required; show: only this period
	Cents       int64  // set: the cap; -1 (the default) is "not given"
}

func (o *CapOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Period, "period", "", "billing period: 2026-11, 2026-W48, 2026-Q4 or 2026-11-30")
	fs.Int64Var(&o.Cents, "cents", -1, "cap in cents (set)")
}

// Validate checks the flags.
func (o *CapOptions) Validate() error {
	if o.Verb == "set" && (o.Period == "" || o.Cents < 0) {
		return cli.Usagef("--period and a non-negative --cents are required")
	}
	return cli.Period("period", o.Period)
}

func capCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " cap"
	fs := cli.NewFlagSet(name, name+" set --period P --cents N | "+name+" show [--period P]", capDescription, stderr)
	o := CapOptions{Cents: -1}
	o.register(fs)
	verb, rest, err := cli.SplitVerb(fs, args, "set", "show")
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	o.Verb, name = verb, name+" "+verb
	if err := cli.ParseFlags(fs, rest); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	caps, err := o.run(ctx)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	writeCaps(stdout, caps)
	return cli.ExitOK
}

func (o *CapOptions) run(ctx context.Context) ([]ledger.Cap, error) {
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	l := ledger.New(pool, o.Schema, nil)
	switch {
	case o.Verb == "set":
		c, err := l.SetCap(ctx, o.Period, o.Cents)
		return []ledger.Cap{c}, err
	case o.Period != "":
		c, err := l.Cap(ctx, o.Period)
		return []ledger.Cap{c}, err
	}
	return l.Caps(ctx)
}

// writeCaps prints caps as a table, amounts as every other output prints
// money (alerts.Money: "137.50 USD"). A cap has no currency of its own; it
// counts the minor units of the period's events, as the spend_cap alert
// shows it.
func writeCaps(w io.Writer, caps []ledger.Cap) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PERIOD\tCAP\tRESERVED\tLEFT\tUPDATED")
	for _, c := range caps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.BillingPeriod, alerts.Money(c.CapCents, ""), alerts.Money(c.ReservedCents, ""),
			alerts.Money(c.CapCents-c.ReservedCents, ""), c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	if len(caps) == 0 {
		fmt.Fprintln(tw, "(no caps)")
	}
	_ = tw.Flush()
}
