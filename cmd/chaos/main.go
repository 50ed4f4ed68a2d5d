// Command chaos is the drill (`make demo`): it reproduces the seed's failure
// modes with the naive consumer and monitor, then with pelguard, against
// real Redis and Postgres and the in-process Stripe emulator, audits both,
// refunds the naive duplicates, and prints what it cost; then the same
// failure modes (and a 25 h gap) for usage sent to Stripe Billing Meters,
// naive with and without an identifier and pelguard, counted per customer.
// It exits 1 when a verdict fails (naive without duplicates, pelguard with
// any, a duplicate the auditor missed or the refund left; a naive meter
// sender that over-counted nothing, pelguard over- or under-counting any
// customer's usage), 2 when it could not run (a
// scenario that did not finish is in the table and the HTML report as a
// FAILED row, and the verdicts do not hold).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/pelguard/pelguard/chaos"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
)

func main() {
	if code, ok := chaos.RunChildIfRequested(); ok {
		os.Exit(code)
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// scenarios is the repeatable --scenario flag.
type scenarios []string

func (s *scenarios) String() string { return strings.Join(*s, ",") }
func (s *scenarios) Set(v string) error {
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			*s = append(*s, x)
		}
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, chaos.TestConfig{})
}

// runWith is run with the drill's test hooks (the tests make a cell miss
// its deadline).
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, test chaos.TestConfig) int {
	if len(args) > 0 && (args[0] == "version" || cli.IsVersionFlag(args[0])) {
		cli.PrintVersion(stdout, "chaos")
		return cli.ExitOK
	}
	var desc strings.Builder
	desc.WriteString("Runs each charge scenario twice, with a naive consumer and XAUTOCLAIM monitor and with\n" +
		"pelguard (consumer + reaper), then the auditor over each (--legacy for the naive charges) and\n" +
		"`" + cmdname.Auditor + " refund` over the naive one. Runs each usage scenario (meter events) three times: the\n" +
		"naive sender without an identifier, with one and no ledger, and pelguard's meter consumer,\n" +
		"counting each customer's meter total at the emulator. Runs usage-busy-customer (usage at volume)\n" +
		"twice at once on the same events, the naive senders and pelguard, timing how long until Stripe\n" +
		"counts them. Exit status: 0 the verdicts hold, 1 one does not, 2 error.\n\nScenarios:\n")
	for _, s := range chaos.Scenarios {
		fmt.Fprintf(&desc, "  %-23s %s\n", s.Name, s.FailureMode)
	}
	fs := cli.NewFlagSet("chaos", "chaos [flags]", desc.String(), stderr)
	cfg := chaos.Config{Test: test}
	var sc scenarios
	var jsonOut bool
	var htmlFile string
	var logging cli.Logging
	cli.RegisterRedis(fs, &cfg.RedisURL)
	cli.RegisterDatabase(fs, &cfg.DatabaseURL)
	fs.IntVar(&cfg.Events, "events", chaos.DefaultEvents, "events per scenario and mode")
	fs.Var(&sc, "scenario", "run only this scenario (repeatable; default all): "+strings.Join(chaos.ScenarioNames(), ", "))
	fs.Int64Var(&cfg.Seed, "seed", chaos.DefaultSeed, "seed for the amounts and for which events meet a fault (the verdicts must not depend on it)")
	fs.DurationVar(&cfg.MinIdle, "min-idle", chaos.DefaultMinIdle, "the monitor's and the reaper's min-idle (the common 60s, scaled down)")
	fs.BoolVar(&jsonOut, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&htmlFile, "html", "", "also write a self-contained HTML report (chart and table) to this file")
	logging.Register(fs)
	// The components log every charge at info: the drill's output is its
	// progress line and table, so it shows only errors unless asked.
	if err := fs.Set("log-level", cli.Env("LOG_LEVEL", "error")); err != nil {
		return cli.Fail(stderr, "chaos", err)
	}
	fs.Lookup("log-level").DefValue = "error"
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, "chaos", err)
	}
	cfg.Scenarios = sc
	logger, err := logging.Logger(stderr)
	if err != nil {
		return cli.Fail(stderr, "chaos", err)
	}
	cfg.Logger = logger
	cfg.Progress, cfg.ProgressRewrite = stderr, isTerminal(stderr)

	ctx, cancel := cli.SignalContext(ctx)
	defer cancel()
	rep, runErr := chaos.Run(ctx, cfg)
	if len(rep.Results) > 0 || len(rep.Usage) > 0 || len(rep.Busy) > 0 || len(rep.Skipped) > 0 {
		var werr error
		if jsonOut {
			werr = rep.WriteJSON(stdout)
		} else {
			werr = rep.WriteTable(stdout)
		}
		if werr != nil {
			return cli.Fail(stderr, "chaos", werr)
		}
		if htmlFile != "" {
			if err := writeHTML(htmlFile, rep); err != nil {
				return cli.Fail(stderr, "chaos", err)
			}
			where := htmlFile
			if abs, err := filepath.Abs(htmlFile); err == nil {
				where = abs
			}
			fmt.Fprintf(stderr, "chaos: the HTML report (chart, table, each scenario explained): %s\n", where)
		}
	}
	if rep.Incomplete() {
		// A cell did not finish: the table and the HTML say which; here the
		// why, and that nothing is proven.
		fmt.Fprintln(stderr, "chaos: VERDICTS DO NOT HOLD: the run is incomplete:")
		for _, x := range rep.Failures() {
			fmt.Fprintln(stderr, "  - "+x)
		}
		return cli.ExitError // the drill's contract: 2 when it could not run
	}
	if runErr != nil {
		cli.Fail(stderr, "chaos", runErr)
		return cli.ExitError // the drill's contract: 2 when it could not run, whatever the reason
	}
	if f := rep.Failures(); len(f) > 0 {
		fmt.Fprintln(stderr, "chaos: VERDICT FAILED:")
		for _, x := range f {
			fmt.Fprintln(stderr, "  - "+x)
		}
		return 1
	}
	var held []string
	if len(rep.Results) > 0 {
		held = append(held, "naive double-charged in every scenario, pelguard never; "+
			"the auditor flagged every duplicate and the refunds left none")
	}
	if len(rep.Usage) > 0 {
		held = append(held, "the naive meter sender over-counted usage (with an identifier, past Stripe's window), "+
			"pelguard counted every customer exactly")
	}
	if len(rep.Busy) > 0 {
		held = append(held, "at volume the naive senders fell behind, pelguard counted every event exactly once within the bound")
	}
	fmt.Fprintf(stderr, "chaos: verdicts hold in %.1fs: %s\n", rep.Elapsed.Seconds(), strings.Join(held, "; "))
	return 0
}

func writeHTML(path string, rep chaos.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing the HTML report: %w", err)
	}
	if err := rep.WriteHTML(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing the HTML report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the HTML report: %w", err)
	}
	return nil
}

// isTerminal reports whether w is a terminal, where the progress line may
// redraw itself.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
