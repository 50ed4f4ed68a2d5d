// Package reapercli is the reaper binary's command line: `run` (with
// --once and --dry-run), `migrate`, their options and Validate, and the
// dry run's decision printer. cmd/reaper only hands it the arguments, the
// signals and the exit code; tests call Main directly.
package reapercli

import (
	"context"
	"io"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
)

// prog is the installed name (make install, the image, the units): help
// and errors use it so that what they print can be typed as it is. role
// is the short name in metrics (pelguard_build_info{role}) and traces.
const (
	role = "reaper"
	prog = cmdname.Reaper
)

// Main runs the reaper's command line and returns the exit code.
// Cancelling ctx is SIGTERM: a running reaper finishes its re-drives in
// flight and returns.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program().Main(ctx, args, stdout, stderr)
}

// program is a function, not a variable: run's --help lists the commands.
func program() *cli.Program {
	return &cli.Program{Name: prog, Commands: []cli.Command{
		{Name: "run", Args: "[flags]", Summary: "a pass every --interval until SIGTERM; --once: one pass; --dry-run: decide only", Run: runCmd},
		{Name: "migrate", Args: "up|down|status|move", Summary: "apply, roll back, list or move the ledger's migrations", Run: migrateCmd},
	}}
}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Migrate(ctx, prog, args, stdout, stderr)
}
