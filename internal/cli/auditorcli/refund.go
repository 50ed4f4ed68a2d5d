package auditorcli

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
)

const refundDescription = `Refunds open duplicate_charge findings (reason duplicate, one idempotency key per charge,
never the canonical charge) and records each refund. It refuses every other kind: an
orphan_charge is usually the customer's only charge for the period (after a ledger loss,
always), and an ambiguous_legacy may be another customer's only charge. Right before each refund it re-reads the
ledger and both charges at Stripe and refuses a duplicate whose canonical charge was refunded,
disputed or is not succeeded, or that changed since the audit. What it cannot refund now
(refused, a transient Stripe error, over --max-refunds/--max-cents for this run or
--max-refunds-24h/--max-cents-24h over every run) is skipped with its reason, and the run goes
on. Exit 1 when duplicates remain open.`

// RefundOptions are the flags of `auditor refund`.
type RefundOptions struct {
	auditOptions
	ID       int64 // the finding to refund; 0 with All
	All      bool
	DryRun   bool
	LockWait time.Duration
}

func (o *RefundOptions) register(fs *flag.FlagSet) {
	o.auditOptions.register(fs)
	fs.BoolVar(&o.All, "all", false, "refund every open duplicate, oldest first")
	fs.BoolVar(&o.DryRun, "dry-run", false, "show what would be refunded; change nothing")
	fs.DurationVar(&o.LockWait, "lock-wait", time.Minute, "wait this long for another refund run")
}

// Validate checks the flags.
func (o *RefundOptions) Validate() error {
	if (o.ID == 0) == !o.All {
		return cli.Usagef("give one finding ID or --all (not both)")
	}
	if o.Config.MaxRefunds <= 0 || o.Config.MaxCents <= 0 || o.Config.MaxRefunds24h <= 0 || o.Config.MaxCents24h <= 0 {
		return cli.Usagef("--max-refunds, --max-cents, --max-refunds-24h and --max-cents-24h must be positive")
	}
	return o.validate()
}

func refundCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " refund"
	fs := cli.NewFlagSet(name, name+" ID|--all [flags]", refundDescription+"\n\n"+permissions, stderr)
	var o RefundOptions
	o.register(fs)
	id, err := findingID(fs, args)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	o.ID = id
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	a, err := o.build(stderr, nil, false)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer a.close()
	if err := a.connect(ctx, 0); err != nil {
		return cli.Fail(stderr, name, err)
	}
	rr, err := a.Refund(ctx, audit.RefundOptions{FindingID: o.ID, DryRun: o.DryRun, LockWait: o.LockWait,
		MaxRefunds: o.Config.MaxRefunds, MaxCents: o.Config.MaxCents})
	if werr := write(stdout, o.JSON, rr, rr.WriteTable); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if rr.StoppedBy != "" || len(rr.Skipped) > 0 {
		return cli.ExitFindings
	}
	return cli.ExitOK
}
