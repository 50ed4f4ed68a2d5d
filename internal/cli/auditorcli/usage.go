package auditorcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
)

const usageDescription = `Reconciles usage sent to Stripe Billing Meters ('pelguard-consumer meter-events'): per meter,
Stripe customer and window (an hour for the last --usage-hourly-for, a UTC day before), Stripe's
meter event summary against the events the ledger delivered. A window is compared once it ended
--usage-settle-delay ago; a difference seen in --usage-stable-checks runs in a row is a finding:
usage_over (Stripe counts more) or usage_under (Stripe counts less). Findings resolve themselves
when the totals agree. With --usage-auto-correct the corrections Stripe allows at the finding's
age are made (an event of the opposite sign for an over-count; the window's events sent again
under their own identifiers, only while Stripe still guards them, for an under-count), each
recorded before its call; otherwise each finding names the correction, in the meter's units.
Stripe permissions: Billing Meters Read (summaries, the meter list); Billing Meter Events Write
only with --usage-auto-correct.
Exit status: 0 no open usage finding, 1 open usage findings, 2 error.`

// registerUsage adds the reconciliation's flags (run, for --schedule, and
// usage).
func registerUsage(fs *flag.FlagSet, u *audit.UsageConfig) {
	fs.DurationVar(&u.SettleDelay, "usage-settle-delay", audit.DefaultUsageSettleDelay,
		"compare a meter window once it ended this long ago (Stripe's summaries lag)")
	fs.IntVar(&u.StableChecks, "usage-stable-checks", audit.DefaultUsageStableChecks,
		"runs in a row that must see one difference before it is a usage finding")
	fs.DurationVar(&u.HourlyFor, "usage-hourly-for", audit.DefaultUsageHourlyFor,
		"compare windows per hour from the UTC midnight before now minus this, per day before (at least 24h)")
	fs.BoolVar(&u.AutoCorrect, "usage-auto-correct", false,
		"make the corrections Stripe allows at a usage finding's age, within the caps (needs Billing Meter Events Write)")
	fs.IntVar(&u.MaxCorrections, "usage-max-corrections", audit.DefaultUsageMaxCorrections, "most usage corrections one run makes")
	fs.Int64Var(&u.MaxUnits, "usage-max-units", audit.DefaultUsageMaxUnits, "most meter units one run's usage corrections move in total")
	fs.IntVar(&u.MaxCorrections24h, "usage-max-corrections-24h", audit.DefaultUsageMaxCorrections24h,
		"most usage corrections in any 24 h, over every run")
	fs.IntVar(&u.MaxWindowCorrections, "usage-max-window-corrections", audit.DefaultUsageMaxWindowCorrections,
		"most corrections one usage window gets over its life (a window that drifts again after them is named for a person)")
	fs.DurationVar(&u.InvoiceGrace, "usage-invoice-grace", audit.DefaultUsageInvoiceGrace,
		"the invoices' finalization grace period: usage of a calendar month is corrected until the next month's start plus this")
	fs.IntVar(&u.MaxResendEvents, "usage-max-resend-events", audit.DefaultUsageMaxResendEvents,
		"most events of one window an under-count correction sends again")
}

// UsageOptions are the flags of `auditor usage`.
type UsageOptions struct {
	auditOptions
	WaitForDeps time.Duration
}

func (o *UsageOptions) register(fs *flag.FlagSet) {
	o.auditOptions.register(fs)
	registerUsage(fs, &o.Config.Usage)
	fs.IntVar(&o.Config.Parallel, "parallel", audit.DefaultParallel, "customers whose summaries are read at once")
	fs.DurationVar(&o.Config.LockWait, "lock-wait", 10*time.Minute, "wait this long for a usage run in progress")
	cli.RegisterWait(fs, &o.WaitForDeps)
}

// Validate checks the flags; audit.New checks the rest.
func (o *UsageOptions) Validate() error {
	if err := cli.ValidateWait(o.WaitForDeps); err != nil {
		return err
	}
	return o.validate()
}

func usageCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " usage"
	var o UsageOptions
	fs := cli.NewFlagSet(name, name+" [flags]", usageDescription, stderr)
	o.register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	a, err := o.build(stderr, nil, true)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer a.close()
	if err := a.connect(ctx, o.WaitForDeps); err != nil {
		return cli.Fail(stderr, name, err)
	}
	rep, err := a.ReconcileUsage(ctx)
	switch {
	case errors.Is(err, audit.ErrUsageSpan):
		fmt.Fprintf(stderr, "%s: nothing to compare: %v\n", name, err)
		return cli.ExitOK
	case errors.Is(err, audit.ErrLocked):
		return cli.Fail(stderr, name, fmt.Errorf("%w (waited --lock-wait %s)", err, o.Config.LockWait))
	case err != nil:
		return cli.Fail(stderr, name, err)
	}
	if err := write(stdout, o.JSON, rep, rep.WriteTable); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if rep.OpenFindings > 0 {
		return cli.ExitFindings
	}
	return cli.ExitOK
}

// UsageFindingsOptions are the flags of `auditor usage-findings`.
type UsageFindingsOptions struct {
	commonOptions
	State, Kind, Meter, Customer string
	Limit                        int
}

func usageFindingsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " usage-findings"
	fs := cli.NewFlagSet(name, name+" [flags]", "Lists usage findings (suspect, open, resolved, dismissed), oldest window first.", stderr)
	var o UsageFindingsOptions
	o.commonOptions.register(fs)
	fs.StringVar(&o.State, "state", "open", "only this state: suspect, open, resolved, dismissed; empty: all")
	fs.StringVar(&o.Kind, "kind", "", "only this kind: usage_over, usage_under")
	fs.StringVar(&o.Meter, "meter", "", "only this meter (its event name)")
	fs.StringVar(&o.Customer, "customer", "", "only this Stripe customer")
	fs.IntVar(&o.Limit, "limit", 1000, "at most this many")
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	switch o.State {
	case "", "suspect", "open", "resolved", "dismissed":
	default:
		return cli.Fail(stderr, name, cli.Usagef("--state %q: want suspect, open, resolved or dismissed", o.State))
	}
	if o.Kind != "" && o.Kind != string(audit.UsageOver) && o.Kind != string(audit.UsageUnder) {
		return cli.Fail(stderr, name, cli.Usagef("--kind %q: want usage_over or usage_under", o.Kind))
	}
	store, cleanup, err := o.store(ctx, stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer cleanup()
	fsl, err := store.UsageFindings(ctx, audit.UsageFilter{State: o.State, Kind: audit.UsageKind(o.Kind),
		EventName: o.Meter, StripeCustomerID: o.Customer, Limit: o.Limit})
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := write(stdout, o.JSON, fsl, func(w io.Writer) error { return audit.WriteUsageFindings(w, fsl) }); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}
