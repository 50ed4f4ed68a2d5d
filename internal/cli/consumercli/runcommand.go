package consumercli

import (
	"context"
	"flag"
	"io"

	"github.com/pelguard/pelguard/internal/cli"
)

// command is what the small ledger commands (meter-cap, meter-settle,
// namespace, replay) share: flags checked, then one run.
type command interface {
	Validate() error
	run(ctx context.Context, stdout io.Writer) error
}

// runCommand parses args into fs, validates o and runs it; every failure
// goes through cli.Fail under name (a usage error exits 2).
func runCommand(ctx context.Context, name string, fs *flag.FlagSet, args []string, o command, stdout, stderr io.Writer) int {
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.run(ctx, stdout); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}
