package consumercli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/meterledger"
)

const meterSettleDescription = `Records what a person found at Stripe about a meter event whose outcome pelguard does not know:
a parked event (its reply was lost and Stripe no longer guards its identifier, or Stripe refused a
later attempt after an earlier one of unknown outcome). Until it is settled the usage
reconciliation leaves its units counted (it never corrects them away) and a replay of it is
refused. Check the meter's events of the customer at Stripe (Dashboard, by identifier), then:

  --counted       Stripe has it: the event is recorded delivered and never sent again.
  --not-counted   Stripe does not have it: the event is recorded failed, its units leave the
                  customer's use of the meter (caps), and 'replay' sends it.

Who ran the command, when, and --reason are kept on the event's row. The event is named by its
identifier and timestamp, as the dead letter (reason meter_event_parked), the alert and the usage
finding print them.`

// MeterSettleOptions are the flags of `consumer meter-settle`.
type MeterSettleOptions struct {
	DatabaseURL string
	Schema      string
	Identifier  string
	EventTS     string
	Counted     bool
	NotCounted  bool
	Reason      string

	ts time.Time
}

func (o *MeterSettleOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Identifier, "identifier", "", "the event's identifier (pg_...) (required)")
	fs.StringVar(&o.EventTS, "event-ts", "", "the event's timestamp, RFC 3339 (required)")
	fs.BoolVar(&o.Counted, "counted", false, "Stripe has the event")
	fs.BoolVar(&o.NotCounted, "not-counted", false, "Stripe does not have the event")
	fs.StringVar(&o.Reason, "reason", "", "what you checked at Stripe and found (required; kept on the row)")
}

// Validate checks the flags.
func (o *MeterSettleOptions) Validate() error {
	if o.Identifier == "" || o.EventTS == "" {
		return cli.Usagef("--identifier and --event-ts are required (the dead letter, alert or usage finding names them)")
	}
	ts, err := time.Parse(time.RFC3339Nano, o.EventTS)
	if err != nil {
		return cli.Usagef("--event-ts %q: want RFC 3339, e.g. 2026-11-30T12:00:00.123Z", o.EventTS)
	}
	o.ts = ts.UTC().Truncate(time.Millisecond)
	if o.Counted == o.NotCounted {
		return cli.Usagef("give exactly one of --counted and --not-counted")
	}
	if strings.TrimSpace(o.Reason) == "" {
		return cli.Usagef("--reason is required: what you checked at Stripe and found")
	}
	return nil
}

func meterSettleCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " meter-settle"
	fs := cli.NewFlagSet(name, name+" --identifier ID --event-ts TS --counted|--not-counted --reason WHY", meterSettleDescription, stderr)
	var o MeterSettleOptions
	o.register(fs)
	return runCommand(ctx, name, fs, args, &o, stdout, stderr)
}

func (o *MeterSettleOptions) run(ctx context.Context, w io.Writer) error {
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := meterledger.New(pool, meterledger.Config{Schema: o.Schema})
	if err != nil {
		return err
	}
	key := meterledger.Key{EventTS: o.ts, Identifier: o.Identifier}
	rec, err := l.Settle(ctx, meterledger.Settlement{Key: key, Counted: o.Counted, By: operator(), Reason: recorded(o.Reason)})
	switch {
	case errors.Is(err, meterledger.ErrNotFound):
		return cli.Usagef("no meter event %s at %s in the ledger", o.Identifier, o.EventTS)
	case errors.Is(err, meterledger.ErrNotUnknown):
		cur, gerr := l.Get(ctx, key)
		if gerr != nil {
			return gerr
		}
		return cli.Usagef("meter event %s is %s: only a parked event (or a failed one after an attempt of unknown outcome) is settled", o.Identifier, cur.Status)
	case err != nil:
		return err
	}
	fmt.Fprintf(w, "meter event %s (%s, %s, value %d) settled as %s by %s\n", rec.Identifier, rec.EventName, rec.StripeCustomerID,
		rec.Value, map[bool]string{true: "counted at Stripe (delivered)", false: "not counted at Stripe (failed; replay sends it)"}[o.Counted], operator())
	return nil
}
