package consumercli

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/redact"
)

const retryDescription = `Bills again, under the next attempt's key, a period's customers whose last attempt failed
for good: a declined card (after the customer replaced it), a charge that needed the customer
(action_required, once they authenticated or added a payment method), a permanent Stripe error
(once fixed at Stripe), and a row the ledger parked after its own retries kept failing. It only
schedules the retry in the ledger: a running consumer charges it within --follow-up-every,
re-reserving the spend cap. Attempt n's key is new only because attempt n-1's failure was
recorded: nothing charged before can be charged twice.

A failed bank debit is re-presented only as its rules allow: never after debit_not_authorized, a
closed or unknown account, or two re-presentments already (NACHA). Those are listed as refused. If
the customer authorised the debit again (a new mandate), --override "why" retries them anyway and
records the reason, with who ran it, on each row.`

// RetryOptions are the flags of `consumer retry`.
type RetryOptions struct {
	DatabaseURL string
	Schema      string
	Period      string
	Customer    string
	Override    string
}

func (o *RetryOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Period, "period", "", "billing period: 2026-11, 2026-W48, 2026-Q4 or 2026-11-30 (required)")
	fs.StringVar(&o.Customer, "customer", "", "only this customer_id (default: every such customer of the period)")
	fs.StringVar(&o.Override, "override", "", "retry bank debits their rules refuse (a new mandate), recording this reason on each row")
}

func retryCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " retry"
	fs := cli.NewFlagSet(name, name+" --period P [--customer C] [--override REASON]", retryDescription, stderr)
	var o RetryOptions
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if o.Period == "" {
		return cli.Fail(stderr, name, cli.Usagef("--period is required"))
	}
	if err := cli.Period("period", o.Period); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if o.Override != "" && strings.TrimSpace(o.Override) == "" {
		return cli.Fail(stderr, name, cli.Usagef("--override needs a reason (who authorised the debit again, and when)"))
	}
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer pool.Close()
	l := ledger.New(pool, o.Schema, nil)
	cands, err := l.RetryCandidates(ctx, o.Period, o.Customer)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	keys, refused := chooseRetries(cands, o.Override != "")
	override := ""
	if o.Override != "" {
		override = fmt.Sprintf("%s (by %s at %s)", recorded(o.Override), operator(), time.Now().UTC().Format(time.RFC3339))
	}
	var recs []ledger.Record
	if len(keys) > 0 {
		if recs, err = l.ScheduleRetries(ctx, keys, override); err != nil {
			return cli.Fail(stderr, name, err)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CUSTOMER\tPERIOD\tSTATUS\tNEXT ATTEMPT\tLAST ERROR")
	for _, r := range recs {
		status := string(r.Status)
		if r.Status == ledger.StatusPending {
			status = "parked → pending"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.CustomerID, r.BillingPeriod, status, r.Attempt, truncate(r.LastError, 80))
	}
	_ = tw.Flush()
	fmt.Fprintf(stdout, "scheduled %d retry(ies); a running consumer charges them within --follow-up-every\n", len(recs))
	if len(refused) > 0 {
		fmt.Fprintf(stdout, "refused %d (bank debit rules; --override \"why\" if the customer authorised again):\n", len(refused))
		for _, r := range refused {
			fmt.Fprintf(stdout, "  %s/%s: %s\n", r.CustomerID, r.BillingPeriod, r.RetryRefusal())
		}
	}
	return cli.ExitOK
}

// chooseRetries splits the candidates into the keys to schedule and the
// rows the bank-debit rules refuse (all scheduled with override).
func chooseRetries(cands []ledger.Record, override bool) (keys []ledger.Key, refused []ledger.Record) {
	for _, r := range cands {
		if !override && r.RetryRefusal() != "" {
			refused = append(refused, r)
			continue
		}
		keys = append(keys, r.Key)
	}
	return keys, refused
}

// operator names who ran the command, for the override's record.
func operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return cmp.Or(os.Getenv("USER"), "unknown")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// recorded is an operator's reason (or name) as it is stored and shown:
// trimmed and redacted as alerts are, so a key or card number pasted into
// --reason never reaches a table, a page or a dead-letter field.
func recorded(s string) string { return redact.String(strings.TrimSpace(s)) }
