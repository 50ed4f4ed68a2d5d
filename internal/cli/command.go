package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/pelguard/pelguard/internal/version"
)

// Command is one subcommand of a binary (`consumer cap`, `auditor refund`).
type Command struct {
	Name    string // as typed: "cap"
	Args    string // what follows the name in the command list: "set|show [flags]"
	Summary string // one line for the command list
	// Run runs the command with the arguments after its name and returns
	// the exit code. -h/--help among them prints the command's usage and
	// exits 0.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// Program is a binary as a list of commands, the first one the default:
// River's rivercli, without a framework. Main dispatches; `help`,
// `help COMMAND`, `version` and --version come with every Program.
type Program struct {
	Name     string // "consumer"
	Commands []Command
}

// Main runs the command args name (the default one when args is empty or
// starts with a flag) and returns the exit code.
func (p *Program) Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if wantsJSON(args) {
		stderr = jsonStderr{stderr}
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && IsVersionFlag(args[0]) {
			PrintVersion(stdout, p.Name)
			return ExitOK
		}
		return p.Commands[0].Run(ctx, args, stdout, stderr)
	}
	name, rest := args[0], args[1:]
	switch name {
	case "version":
		PrintVersion(stdout, p.Name)
		return ExitOK
	case "help":
		// Asked for, the usage goes to stdout (pipe it to less) and exits 0.
		if len(rest) == 0 || rest[0] == "help" || rest[0] == "version" {
			return p.Commands[0].Run(ctx, []string{"--help"}, stdout, stdout)
		}
		c := p.lookup(rest[0])
		if c == nil {
			return Fail(stderr, p.Name, p.unknown(rest[0]))
		}
		return c.Run(ctx, []string{"--help"}, stdout, stdout)
	}
	c := p.lookup(name)
	if c == nil {
		return Fail(stderr, p.Name, p.unknown(name))
	}
	return c.Run(ctx, rest, stdout, stderr)
}

func (p *Program) lookup(name string) *Command {
	for i := range p.Commands {
		if p.Commands[i].Name == name {
			return &p.Commands[i]
		}
	}
	return nil
}

func (p *Program) unknown(name string) error {
	names := make([]string, 0, len(p.Commands)+2)
	for _, c := range p.Commands {
		names = append(names, c.Name)
	}
	return Usagef("unknown command %q: want %s, help or version", name, strings.Join(names, ", "))
}

// CommandList is the "Commands:" paragraph of the default command's --help.
func (p *Program) CommandList() string {
	var b strings.Builder
	b.WriteString("Commands:\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for i, c := range p.Commands {
		name := strings.TrimSpace(c.Name + " " + c.Args)
		if i == 0 {
			name += " (default)"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, c.Summary)
	}
	fmt.Fprintf(tw, "  help [COMMAND]\tthis text, or a command's flags\n")
	fmt.Fprintf(tw, "  version, --version\tthe version, revision and Go version of this build\n")
	_ = tw.Flush()
	fmt.Fprintf(&b, "Run '%s COMMAND --help' for the flags of a command.", p.Name)
	return b.String()
}

// IsVersionFlag reports whether arg asks for the version.
func IsVersionFlag(arg string) bool { return arg == "--version" || arg == "-version" }

// PrintVersion writes "<prog> <version> (revision …, go…)".
func PrintVersion(w io.Writer, prog string) {
	fmt.Fprintf(w, "%s %s\n", prog, version.Get())
}

// IsHelpFlag reports whether arg asks for the usage.
func IsHelpFlag(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// SplitVerb takes the verb a command needs before its flags (`migrate up`,
// `cap set`). -h/--help in its place prints fs's usage and returns
// flag.ErrHelp (Fail turns it into exit 0); no verb, a flag or an unknown
// verb is a UsageError.
func SplitVerb(fs *flag.FlagSet, args []string, verbs ...string) (string, []string, error) {
	what := fs.Name()[strings.LastIndex(fs.Name(), " ")+1:] // "consumer migrate" → "migrate"
	want := strings.Join(verbs, ", ")
	if i := strings.LastIndex(want, ", "); i >= 0 {
		want = want[:i] + " or " + want[i+2:]
	}
	switch {
	case len(args) == 0:
		return "", nil, Usagef("%s needs a command: %s", what, want)
	case IsHelpFlag(args[0]):
		fs.Usage()
		return "", nil, flag.ErrHelp
	}
	for _, v := range verbs {
		if args[0] == v {
			return v, args[1:], nil
		}
	}
	return "", nil, Usagef("unknown %s command %q: want %s", what, args[0], want)
}
