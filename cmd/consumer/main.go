// Command consumer (installed as pelguard-consumer) charges billing events from a Redis Stream consumer group
// through Stripe, exactly once per customer and billing period.
//
//	pelguard-consumer [run] [flags]              consume until SIGTERM/SIGINT
//	pelguard-consumer cap set --period P --cents N
//	pelguard-consumer cap show
//	pelguard-consumer replay --reason R [--limit N] [--dry-run]
//	pelguard-consumer migrate up|down|status
//	pelguard-consumer help [COMMAND] | version
//
// Exit status: 0 ok, 2 bad flags or configuration, 3 Redis or Postgres
// unreachable after --wait-for-deps. The commands live in
// internal/cli/consumercli.
package main

import (
	"context"
	"os"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/consumercli"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background())
	code := consumercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
