// Command reaper (installed as pelguard-reaper) recovers what dead billing consumers leave pending, checking
// the ledger before every claim. It replaces the naive XAUTOCLAIM monitor.
//
//	pelguard-reaper [run] [flags]             a pass every --interval until SIGTERM/SIGINT
//	pelguard-reaper --once [flags]            one pass (cron)
//	pelguard-reaper --dry-run [--json] ...    print every decision, change nothing
//	pelguard-reaper migrate up|down|status
//	pelguard-reaper help [COMMAND] | version
//
// Exit status: 0 ok, 2 bad flags or configuration (or a failed pass), 3
// Redis or Postgres unreachable after --wait-for-deps. The commands live in
// internal/cli/reapercli.
package main

import (
	"context"
	"os"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/reapercli"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background())
	code := reapercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
