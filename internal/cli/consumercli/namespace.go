package consumercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

const namespaceDescription = `A stream's namespace is part of every idempotency key (charges) and meter-event identifier
(usage) of its events, so every role of the stream must run with the same one. The first
consumer, meter consumer or reaper to use a stream records the namespace it runs with (after
checking it against the ledger's rows); a role started with another one refuses to start.

show lists what each stream records. set changes it: only when the stream's events are to be
keyed anew (a namespace that was wrong from the start, or an environment renamed), with every
role of the stream stopped and restarted with the new --namespace afterwards. Events already
billed under the old namespace keep their rows, but a redelivery of one of them is then
dead-lettered conflicting_event instead of billed again. Each change is recorded with who and
why (stream_fact_changes).`

// NamespaceOptions are the flags of `consumer namespace set|show`.
type NamespaceOptions struct {
	Verb        string
	DatabaseURL string
	Schema      string
	Stream      string
	Group       string
	Kind        string
	Namespace   string
	Reason      string
	By          string
}

func (o *NamespaceOptions) register(fs *flag.FlagSet) {
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	fs.StringVar(&o.Stream, "stream", "", "the stream (set)")
	fs.StringVar(&o.Group, "group", cli.Env("PELGUARD_GROUP", "billing-group"), "its consumer group [PELGUARD_GROUP]")
	fs.StringVar(&o.Kind, "kind", "", "what the stream carries: charges or usage (set; default: what it records, else charges)")
	fs.StringVar(&o.Namespace, "namespace", "", "the stream's new namespace (set)")
	fs.StringVar(&o.Reason, "reason", "", "why (set; recorded)")
	fs.StringVar(&o.By, "by", defaultActor(), "who is changing it (recorded)")
}

func defaultActor() string {
	host, _ := os.Hostname()
	return cli.Env("USER", "operator") + "@" + host
}

// Validate checks the flags.
func (o *NamespaceOptions) Validate() error {
	if o.Verb != "set" {
		return nil
	}
	switch {
	case o.Stream == "" || o.Group == "":
		return cli.Usagef("--stream and --group name the stream whose namespace to set")
	case strings.TrimSpace(o.Namespace) == "":
		return cli.Usagef("--namespace is required: the namespace every role of the stream will run with")
	case strings.TrimSpace(o.Reason) == "":
		return cli.Usagef("--reason is required: it is recorded with the change")
	case o.Kind != "" && o.Kind != string(streamfacts.Charges) && o.Kind != string(streamfacts.Usage):
		return cli.Usagef("--kind %q: want charges or usage", o.Kind)
	case strings.TrimSpace(o.By) == "":
		return cli.Usagef("--by must name who changes it")
	}
	return nil
}

func namespaceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " namespace"
	fs := cli.NewFlagSet(name, name+" set --stream S --group G --namespace N --reason R | "+name+" show", namespaceDescription, stderr)
	var o NamespaceOptions
	o.register(fs)
	verb, rest, err := cli.SplitVerb(fs, args, "set", "show")
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	o.Verb, name = verb, name+" "+verb
	return runCommand(ctx, name, fs, rest, &o, stdout, stderr)
}

func (o *NamespaceOptions) run(ctx context.Context, stdout io.Writer) error {
	pool, err := cli.OpenDB(ctx, prog, o.DatabaseURL, o.Schema, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if o.Verb == "set" {
		s := streamfacts.Stream{Name: o.Stream, Group: o.Group, Kind: streamfacts.Kind(o.Kind)}
		if s.Kind == "" {
			s.Kind = streamfacts.Charges
			if f, ok, err := streamfacts.Read(ctx, pool, o.Schema, s); err != nil {
				return err
			} else if ok {
				s.Kind = f.Stream.Kind
			}
		}
		old, err := streamfacts.Set(ctx, pool, o.Schema, s, o.Namespace, recorded(o.By), recorded(o.Reason))
		if err != nil {
			return err
		}
		if old == "" {
			old = "(none)"
		}
		fmt.Fprintf(stdout, "stream %s (%s): namespace %s -> %s; restart every role of the stream with --namespace %s\n",
			s, s.Kind, old, o.Namespace, o.Namespace)
		return nil
	}
	facts, err := streamfacts.List(ctx, pool, o.Schema)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tGROUP\tKIND\tNAMESPACE\tRECORDED\tBY")
	for _, f := range facts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Stream.Name, f.Stream.Group, f.Stream.Kind, f.Namespace,
			f.RecordedAt.UTC().Format(time.RFC3339), f.RecordedBy)
	}
	if len(facts) == 0 {
		fmt.Fprintln(tw, "(no stream has recorded its namespace yet)")
	}
	return tw.Flush()
}
