package auditorcli

import (
	"context"
	"flag"
	"io"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
)

// FindingsOptions are the flags of `auditor findings`.
type FindingsOptions struct {
	commonOptions
	Kind, State, Period string
	Limit               int
}

func (o *FindingsOptions) register(fs *flag.FlagSet) {
	o.commonOptions.register(fs)
	fs.StringVar(&o.Kind, "kind", "", "only this kind: duplicate_charge, orphan_charge, missing_charge, amount_mismatch, stuck_pending")
	fs.StringVar(&o.State, "state", "", "only this state: open, refunded, resolved, dismissed")
	fs.StringVar(&o.Period, "period", "", "only this billing period")
	fs.IntVar(&o.Limit, "limit", 1000, "at most this many")
}

func (o *FindingsOptions) filter() audit.Filter {
	return audit.Filter{Kind: audit.Kind(o.Kind), State: audit.State(o.State), Period: o.Period, Limit: o.Limit}
}

// Validate checks the flags.
func (o *FindingsOptions) Validate() error {
	if err := cli.Period("period", o.Period); err != nil {
		return err
	}
	return checkFilter(o.filter())
}

func findingsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " findings"
	fs := cli.NewFlagSet(name, name+" [flags]", "Lists findings, newest first.", stderr)
	var o FindingsOptions
	o.register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	store, cleanup, err := o.store(ctx, stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	defer cleanup()
	fsl, err := store.Findings(ctx, o.filter())
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := write(stdout, o.JSON, fsl, func(w io.Writer) error { return audit.WriteFindings(w, fsl) }); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}

// SetStateOptions are the flags of `auditor resolve` and `auditor dismiss`.
type SetStateOptions struct {
	commonOptions
	Verb string // "resolve" or "dismiss"
	ID   int64
}

// Validate checks the flags.
func (o *SetStateOptions) Validate() error {
	if o.ID == 0 {
		return cli.Usagef("give the finding ID")
	}
	return nil
}

func setStateCmd(verb string) func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		name := prog + " " + verb
		fs := cli.NewFlagSet(name, name+" ID [flags]",
			"resolve: the finding was handled by hand (open or dismissed → resolved).\n"+
				"dismiss: the finding is not a problem (open → dismissed). Reruns never reopen either.", stderr)
		o := SetStateOptions{Verb: verb}
		o.register(fs)
		id, err := findingID(fs, args)
		if err != nil {
			return cli.Fail(stderr, name, err)
		}
		o.ID = id
		if err := o.Validate(); err != nil {
			return cli.Fail(stderr, name, err)
		}
		store, cleanup, err := o.store(ctx, stderr)
		if err != nil {
			return cli.Fail(stderr, name, err)
		}
		defer cleanup()
		change := store.Resolve
		if verb == "dismiss" {
			change = store.Dismiss
		}
		fd, err := change(ctx, o.ID)
		if err != nil {
			return cli.Fail(stderr, name, err)
		}
		if err := write(stdout, o.JSON, fd, func(w io.Writer) error { return audit.WriteFindings(w, []audit.Finding{fd}) }); err != nil {
			return cli.Fail(stderr, name, err)
		}
		return cli.ExitOK
	}
}
