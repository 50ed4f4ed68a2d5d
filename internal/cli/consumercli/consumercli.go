// Package consumercli is the consumer binary's command line: the commands
// (run, cap, replay, migrate), their options and Validate, the table
// printers, and the supervisor that runs one consumer per stream.
// cmd/consumer only hands it the arguments, the signals and the exit code;
// tests call Main directly.
package consumercli

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
	role = "consumer"
	prog = cmdname.Consumer
)

// Main runs the consumer's command line and returns the exit code (see
// cli.ExitOK and the others). Cancelling ctx is SIGTERM: `run` stops
// reading, finishes the events in flight and returns.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program().Main(ctx, args, stdout, stderr)
}

// program is a function, not a variable: run's --help lists the commands.
func program() *cli.Program {
	return &cli.Program{Name: prog, Commands: []cli.Command{
		{Name: "run", Args: "[flags]", Summary: "consume until SIGTERM/SIGINT", Run: runCmd},
		{Name: "cap", Args: "set|show [flags]", Summary: "set or show a billing period's spend cap", Run: capCmd},
		{Name: "meter-cap", Args: "set|show|remove [flags]", Summary: "set, show or remove a meter's spend cap per customer and month, in the meter's units", Run: meterCapCmd},
		{Name: "meter-settle", Args: "--identifier ID --event-ts TS --counted|--not-counted --reason WHY", Summary: "record whether Stripe counted a parked meter event, once a person checked", Run: meterSettleCmd},
		{Name: "namespace", Args: "set|show [flags]", Summary: "show or change (audited) the namespace each stream's roles must run with", Run: namespaceCmd},
		{Name: "pause", Args: "--stream S --reason R", Summary: "stop every consumer and re-drive of a stream from calling Stripe, fleet-wide, until resumed", Run: pauseCmd},
		{Name: "resume", Args: "--stream S --reason R", Summary: "let a paused stream's billing continue", Run: resumeCmd},
		{Name: "paused", Args: "", Summary: "list the paused streams: since when, by whom, why", Run: pausedCmd},
		{Name: "replay", Args: "[flags]", Summary: "put dead letters back on their stream", Run: replayCmd},
		{Name: "retry", Args: "--period P [--customer C]", Summary: "bill again, under a new attempt's key, customers whose last attempt failed", Run: retryCmd},
		{Name: "meter-events", Args: "[flags]", Summary: "send usage events to Stripe Billing Meters, each counted once, until SIGTERM", Run: meterCmd},
		{Name: "webhook", Args: "[--listen :8089]", Summary: "receive Stripe webhooks that settle bank debits in motion (optional)", Run: webhookCmd},
		{Name: "import", Args: "(--from-table T | --from-query SQL | --from-stripe --period P)... [flags]", Summary: "bring what an existing consumer billed into the ledger before switching", Run: importCmd},
		{Name: "migrate", Args: "up|down|status|move", Summary: "apply, roll back, list or move the ledger's migrations", Run: migrateCmd},
	}}
}

func importCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Import(ctx, prog, args, stdout, stderr)
}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Migrate(ctx, prog, args, stdout, stderr)
}
