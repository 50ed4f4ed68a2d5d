// Package auditorcli is the auditor binary's command line: run (once or
// on a --schedule), refund, findings, resolve, dismiss and migrate, their
// options and Validate. cmd/auditor only hands it the arguments, the
// signals and the exit code; tests call Main directly.
package auditorcli

import (
	"context"
	"fmt"
	"io"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
)

// prog is the installed name (make install, the image, the units): help
// and errors use it so that what they print can be typed as it is. role
// is the short name in metrics (pelguard_build_info{role}) and traces.
const (
	role = "auditor"
	prog = cmdname.Auditor
)

// Main runs the auditor's command line and returns the exit code: 0 clean,
// 1 open findings (cli.ExitFindings), 2 error, 3 Postgres unreachable after
// --wait-for-deps. Cancelling ctx is SIGTERM: a scheduled auditor waits for
// the run in progress, up to --shutdown-timeout.
//
// With no argument at all it audits nothing: an audit reads Stripe and may
// alert, so it is asked for by name (`pelguard-auditor run`); it prints
// the commands and exits 2. Flags alone (`pelguard-auditor --period P`)
// still run the default command, as the units written so far do.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	p := program()
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: no command given: '%s run' audits since the last checkpoint.\n%s\n", prog, prog, p.CommandList())
		return cli.ExitError
	}
	return p.Main(ctx, args, stdout, stderr)
}

// program is a function, not a variable: run's --help lists the commands.
func program() *cli.Program {
	return &cli.Program{Name: prog, Commands: []cli.Command{
		{Name: "run", Args: "[flags]", Summary: "audit a window (default: since the last checkpoint), or on a --schedule", Run: runCmd},
		{Name: "refund", Args: "ID|--all [flags]", Summary: "refund duplicate findings within caps", Run: refundCmd},
		{Name: "findings", Args: "[flags]", Summary: "list findings", Run: findingsCmd},
		{Name: "usage", Args: "[flags]", Summary: "reconcile Stripe's meter totals with the meter ledger once (and correct, when told)", Run: usageCmd},
		{Name: "usage-findings", Args: "[flags]", Summary: "list usage findings", Run: usageFindingsCmd},
		{Name: "resolve", Args: "ID", Summary: "close a finding handled by hand", Run: setStateCmd("resolve")},
		{Name: "dismiss", Args: "ID", Summary: "close a finding that is not a problem", Run: setStateCmd("dismiss")},
		{Name: "migrate", Args: "up|down|status|move", Summary: "apply, roll back, list or move the ledger's migrations", Run: migrateCmd},
	}}
}

// exitStatus is the auditor's exit status paragraph, in run's --help.
const exitStatus = `Exit status: 0 clean, 1 open findings remain when the run ends (of --period, when given;
stored by this run, an earlier one or 'pelguard-consumer import'), or duplicates left unrefunded, 2 error
(bad flags or configuration, a failed run), 3 Postgres still unreachable after --wait-for-deps.`

// permissions is what the auditor's Stripe key needs, shown in --help.
const permissions = `Stripe permissions (a restricted key, rk_live_…): Charges Read and PaymentIntents Read; Refunds
Write only for 'pelguard-auditor refund' and --auto-refund (give plain runs a key without it). An
unrestricted sk_live_ key is refused unless --allow-unrestricted-key. A 403 names the missing
permission, fails the run (exit 2) and alerts Slack.`

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Migrate(ctx, prog, args, stdout, stderr)
}
