// Command auditor (installed as pelguard-auditor) diffs Stripe charges against pelguard's ledger, records
// every discrepancy, alerts with the new ones and refunds duplicates when
// told to. See audit/README.md for the flags, exit codes and what to do
// about each finding kind.
//
//	pelguard-auditor [run] [flags]             audit a window (default: since the last checkpoint)
//	pelguard-auditor run --schedule CRON       audit on a schedule until SIGTERM/SIGINT
//	pelguard-auditor refund ID|--all [flags]   refund duplicate findings within caps
//	pelguard-auditor findings [flags]          list findings
//	pelguard-auditor resolve ID | dismiss ID   close a finding by hand
//	pelguard-auditor migrate up|down|status    manage the schema
//	pelguard-auditor help [COMMAND] | version
//
// Exit status: 0 clean, 1 open findings, 2 error, 3 Postgres unreachable
// after --wait-for-deps. The commands live in internal/cli/auditorcli.
package main

import (
	"context"
	"os"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/auditorcli"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background())
	code := auditorcli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
