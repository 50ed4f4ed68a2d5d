package audit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/stripeapi"
)

// The auditor in a team's service: a run every 15 minutes over what is new
// since the last checkpoint. It builds its own Stripe adapter from the
// stripeapi.Config (a restricted key with read access to charges is enough
// unless it refunds). It needs Postgres, so this example only compiles
// (examples/embed runs the same).
func Example() {
	ctx := context.Background()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		logger.Error("postgres", "error", err)
		return
	}
	defer pool.Close()

	a, err := audit.New(audit.Config{
		DB: pool, Schema: "pelguard",
		Stripe: stripeapi.Config{APIKey: os.Getenv("STRIPE_API_KEY"), RateLimit: 25},
		Logger: logger,
	})
	if err != nil {
		logger.Error("auditor", "error", err)
		return
	}
	s, err := a.NewScheduler("*/15 * * * *", func(rep audit.Report, err error) {
		if err == nil && rep.NewFindings > 0 {
			logger.Warn("audit found discrepancies", "new", rep.NewFindings, "run", rep.RunID)
		}
	})
	if err != nil {
		logger.Error("schedule", "error", err)
		return
	}
	if err := s.Start(ctx); err != nil {
		logger.Error("start", "error", err)
		return
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = s.Stop(stopCtx) // waits for a run in progress
	}()
}

// One run over a billing period, as `auditor --period 2026-11` does: a
// manual window, which does not move the checkpoint. Compile-only: it needs
// Postgres.
func ExampleAuditor_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return
	}
	defer pool.Close()
	a, err := audit.New(audit.Config{DB: pool, Stripe: stripeapi.Config{APIKey: os.Getenv("STRIPE_API_KEY")}})
	if err != nil {
		return
	}
	rep, err := a.Run(ctx, audit.Window{Period: "2026-11"})
	switch {
	case errors.Is(err, audit.ErrLocked):
		fmt.Println("another run is in progress")
	case err != nil:
		fmt.Println(err)
	default:
		_ = audit.WriteFindings(os.Stdout, rep.Findings)
		fmt.Println("exit status", rep.ExitCode()) // 1 when findings are open
	}
}

// New validates the Config and builds the Stripe adapter; its errors name
// the fix, all of them at once. Building an auditor connects to nothing: the
// pool here is never used.
func ExampleNew() {
	_, err := audit.New(audit.Config{Parallel: 100, LegacyPattern: "no group"})
	fmt.Println(err)

	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	_, err = audit.New(audit.Config{DB: pool, Stripe: stripeapi.Config{APIKey: "sk_live_example"}})
	fmt.Println(errors.Is(err, stripeapi.ErrUnrestrictedKey))
	_, err = audit.New(audit.Config{DB: pool, Stripe: stripeapi.Config{APIKey: "sk_test_example"}})
	fmt.Println(err)
	// Output:
	// audit config: a Postgres pool (DB) is required
	// --parallel 100: want 1 to 64
	// --legacy-pattern "no group" needs a group that captures the period, such as "^Usage billing for (\\S+)$"
	// true
	// <nil>
}

// A zero Window is "since the last checkpoint"; any bound makes it manual.
func ExampleWindow_Manual() {
	fmt.Println(audit.Window{}.Manual(), audit.Window{Period: "2026-11"}.Manual())
	// Output: false true
}
