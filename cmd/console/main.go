// Command console (installed as pelguard-console) serves pelguard's web
// console: the ledger, the findings, the dead letters and the PEL in a
// browser, and — with --allow-actions — refunds, dismissals, resolutions
// and replays behind a per-user identity, a confirmation and a reason.
//
//	pelguard-console [serve] --users-file FILE [flags]
//	pelguard-console serve --proxy-user-header X-Forwarded-User --trusted-proxy 10.0.0.0/8
//	pelguard-console hash-password < password
//	pelguard-console migrate up|down|status
//	pelguard-console help [COMMAND] | version
//
// Exit status: 0 stopped cleanly, 2 bad flags or configuration, 3 Redis or
// Postgres unreachable after --wait-for-deps. The commands live in
// internal/cli/consolecli.
package main

import (
	"context"
	"os"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/consolecli"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background())
	code := consolecli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
