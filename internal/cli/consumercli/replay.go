package consumercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
)

const replayDescription = `Puts dead letters back on the stream with their original fields, oldest first, and removes
them from <stream>:dead: for events parked as spend_cap or no_spend_cap (after raising or
setting the cap), stripe_key_error (after fixing the key), action_required (once the customer
authenticated or added a payment method) or stripe_permanent_error (once fixed at Stripe). Each
replayed entry carries replayed_from=<dead letter id>: for an action_required or failed row that
is what charges again, under the next attempt's key. The ledger makes a replay safe: an event
already billed is acked without a second charge.

A meter consumer run with --send-from-ledger records the replayed entry at ingest: the event's
row in the meter ledger (failed or parked) is queued again and its senders send it under its
identifier, as they send every event; the entry is acked once recorded.

A meter event Stripe may have counted (parked: its outcome unknown) is not sent again once the
safe window of its first attempt has passed: the replay is refused (reason meter_replay_refused),
as Stripe may no longer refuse its identifier. Check the meter's events at Stripe and settle it
('meter-settle'); only if Stripe does not have it, --override "why" sends it anyway and records
the reason, with who ran it and when, on the event's row.`

// ReplayOptions are the flags of `consumer replay`.
type ReplayOptions struct {
	RedisURL string
	Streams  cli.Streams
	Group    string
	Reason   string // empty: every reason
	Limit    int    // per stream; 0: all
	DryRun   bool
	Override string

	streams []cli.StreamGroup // resolved by Validate
}

func (o *ReplayOptions) register(fs *flag.FlagSet) {
	cli.RegisterRedis(fs, &o.RedisURL)
	cli.RegisterStreams(fs, &o.Streams, &o.Group, "replay the dead letters of")
	fs.StringVar(&o.Reason, "reason", "", "only dead letters with this reason (e.g. spend_cap, stripe_key_error); empty: all")
	fs.IntVar(&o.Limit, "limit", 0, "replay at most this many per stream (0: all)")
	cli.ZeroMeans(fs, "limit")
	fs.BoolVar(&o.DryRun, "dry-run", false, "list what would be replayed, change nothing")
	fs.StringVar(&o.Override, "override", "", "send meter events Stripe may have counted even past their safe window, recording this reason (you checked: Stripe does not have them)")
}

// Validate checks the flags and resolves the streams.
func (o *ReplayOptions) Validate() error {
	if o.Limit < 0 {
		return cli.Usagef("--limit must not be negative")
	}
	if o.Override != "" && strings.TrimSpace(o.Override) == "" {
		return cli.Usagef("--override needs a reason (what you checked at Stripe)")
	}
	streams, err := o.Streams.Resolve(o.Group)
	if err != nil {
		return err
	}
	o.streams = streams
	return nil
}

func replayCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " replay"
	fs := cli.NewFlagSet(name, name+" [--stream S]... [--reason R] [--limit N] [--dry-run] [--override WHY]", replayDescription, stderr)
	var o ReplayOptions
	o.register(fs)
	return runCommand(ctx, name, fs, args, &o, stdout, stderr)
}

// run replays stream by stream, printing each stream's table as it goes.
func (o *ReplayOptions) run(ctx context.Context, stdout io.Writer) error {
	rdb, err := cli.OpenRedis(ctx, o.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	seen := map[string]bool{} // a stream read by two groups has one dead-letter stream
	for _, sg := range o.streams {
		if seen[sg.Stream] {
			continue
		}
		seen[sg.Stream] = true
		override := ""
		if o.Override != "" {
			override = fmt.Sprintf("%s (by %s at %s)", recorded(o.Override), operator(), time.Now().UTC().Format(time.RFC3339))
		}
		done, err := consumer.ReplayDeadLettersOverride(ctx, rdb, sg.Stream, o.Reason, o.Limit, o.DryRun, override)
		writeReplayed(stdout, sg.Stream, done, o.DryRun)
		if err != nil {
			return err
		}
	}
	return nil
}

// writeReplayed prints what one stream's replay did (or would do).
func writeReplayed(w io.Writer, stream string, done []consumer.Replayed, dryRun bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEAD LETTER\tSOURCE\tREASON\tREPLAYED AS")
	for _, r := range done {
		as := r.NewID
		if dryRun {
			as = "(dry run)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.DeadID, r.SourceID, r.Reason, as)
	}
	_ = tw.Flush()
	verb := "replayed"
	if dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(w, "%s %d dead letter(s) onto %s\n", verb, len(done), stream)
}
