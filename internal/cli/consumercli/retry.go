package consumercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
)

const retryDescription = `Bills again, under the next attempt's key, a period's customers whose last attempt failed
for good: a declined card (after the customer replaced it), a charge that needed the customer
(action_required, once they authenticated or added a payment method), a permanent Stripe error
(once fixed at Stripe). It only schedules the retry in the ledger: a running consumer charges it
within --follow-up-every, re-reserving the spend cap. Attempt n's key is new only because attempt
n-1's failure was recorded: nothing charged before can be charged twice.`

// RetryOptions are the flags of `consumer retry`.
type RetryOptions struct {
	DatabaseURL string
	Schema      string
	Period      string
	Customer    string
}

func (o *RetryOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Period, "period", "", "billing period, e.g. 2026-11 (required)")
	fs.StringVar(&o.Customer, "customer", "", "only this customer_id (default: every such customer of the period)")
}

func retryCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " retry"
	fs := cli.NewFlagSet(name, name+" --period P [--customer C]", retryDescription, stderr)
	var o RetryOptions
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if o.Period == "" {
		return cli.Fail(stderr, name, cli.Usagef("--period is required"))
	}
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer pool.Close()
	recs, err := ledger.New(pool, o.Schema, nil).RequestRetry(ctx, o.Period, o.Customer)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CUSTOMER\tPERIOD\tSTATUS\tNEXT ATTEMPT\tLAST ERROR")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.CustomerID, r.BillingPeriod, r.Status, r.Attempt, truncate(r.LastError, 80))
	}
	_ = tw.Flush()
	fmt.Fprintf(stdout, "scheduled %d retry(ies); a running consumer charges them within --follow-up-every\n", len(recs))
	return cli.ExitOK
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
