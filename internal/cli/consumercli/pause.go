package consumercli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

const pauseDescription = `Pauses billing from a stream, fleet-wide: within about a second every consumer, meter consumer
and reaper of the stream stops calling Stripe for it (a call already in flight finishes and is
recorded). Paused consumers read nothing new and hold no ledger leases; what they had read stays
pending; the reaper leaves the stream alone; money in motion (bank debits being polled, decline
retries) waits too. resume lets everything continue where it stopped: nothing is lost or billed
twice. Each pause and resume is recorded (who, when, why) and sent to Slack once.

A long pause has costs: an event whose Stripe outcome was unknown when the pause began can be
re-sent under its key only within 23 h of its first attempt; past that it is looked up at Stripe
(charges) or parked with an alert (meter events) on resume. Stripe takes meter events at most 35
days old: usage older than that when billing resumes is dead-lettered, not sent.

paused lists the paused streams (also the console's banner and pelguard_stream_paused).`

// PauseOptions are the flags of `consumer pause` and `consumer resume`.
type PauseOptions struct {
	DatabaseURL string
	Schema      string
	Streams     cli.Streams
	Group       string
	Reason      string
	By          string
	Slack       cli.Slack
	Log         cli.Logging

	streams []cli.StreamGroup
}

func (o *PauseOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	cli.RegisterStreams(fs, &o.Streams, &o.Group, "pause or resume")
	fs.StringVar(&o.Reason, "reason", "", "why (required; recorded and sent to Slack)")
	fs.StringVar(&o.By, "by", defaultActor(), "who (recorded)")
	o.Slack.Register(fs)
	o.Log.Register(fs)
}

// Validate checks the flags.
func (o *PauseOptions) Validate() error {
	if err := cli.CheckSchemaFlag(o.DatabaseURL, o.Schema); err != nil {
		return err
	}
	streams, err := o.Streams.Resolve(o.Group)
	if err != nil {
		return err
	}
	o.streams = streams
	switch {
	case strings.TrimSpace(o.Reason) == "":
		return cli.Usagef("--reason is required: it is recorded with the change and sent to Slack")
	case strings.TrimSpace(o.By) == "":
		return cli.Usagef("--by must name who pauses or resumes")
	}
	return o.Log.Validate()
}

func pauseCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return pauseOrResume(ctx, "pause", true, args, stdout, stderr)
}

func resumeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return pauseOrResume(ctx, "resume", false, args, stdout, stderr)
}

func pauseOrResume(ctx context.Context, verb string, pause bool, args []string, stdout, stderr io.Writer) int {
	name := prog + " " + verb
	fs := cli.NewFlagSet(name, name+" --stream S [--group G] --reason R", pauseDescription, stderr)
	var o PauseOptions
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.run(ctx, pause, stdout, stderr); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}

func (o *PauseOptions) run(ctx context.Context, pause bool, stdout, stderr io.Writer) error {
	logger, err := o.Log.Logger(stderr)
	if err != nil {
		return err
	}
	n, err := o.Slack.Notifier(logger, nil)
	if err != nil {
		return err
	}
	defer closeNotifier(n)
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, sg := range o.streams {
		err := streamfacts.SetPaused(ctx, pool, o.Schema, sg.Stream, sg.Group, pause, recorded(o.By), recorded(o.Reason))
		switch {
		case errors.Is(err, streamfacts.ErrAlreadyPaused):
			fmt.Fprintf(stdout, "%s: already paused\n", sg)
			continue
		case errors.Is(err, streamfacts.ErrNotPaused):
			fmt.Fprintf(stdout, "%s: not paused\n", sg)
			continue
		case err != nil:
			return err
		}
		n.Notify(alerts.StreamPaused(sg.Stream, sg.Group, pause, recorded(o.By), recorded(o.Reason)))
		if pause {
			fmt.Fprintf(stdout, "%s: paused; the fleet stops calling Stripe for it within seconds. Resume with `%s resume --stream %s --group %s --reason ...`\n",
				sg, prog, sg.Stream, sg.Group)
		} else {
			fmt.Fprintf(stdout, "%s: resumed\n", sg)
		}
	}
	return nil
}

func pausedCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " paused"
	fs := cli.NewFlagSet(name, name, pauseDescription, stderr)
	var dbURL, schema string
	cli.RegisterDatabase(fs, &dbURL)
	cli.RegisterSchema(fs, &schema)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	pool, err := cli.OpenDB(ctx, prog, dbURL, schema, 2)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer pool.Close()
	ps, err := streamfacts.Pauses(ctx, pool, schema)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tGROUP\tPAUSED SINCE\tFOR\tBY\tREASON")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Stream, p.Group, p.At.UTC().Format(time.RFC3339),
			time.Since(p.At).Round(time.Second), p.By, p.Reason)
	}
	if len(ps) == 0 {
		fmt.Fprintln(tw, "(no stream is paused)")
	}
	_ = tw.Flush()
	return cli.ExitOK
}
