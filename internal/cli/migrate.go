package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/migrations"
)

// Migrate runs `<prog> migrate up|down|status`. It returns an exit code.
// It waits for Postgres like the long-running commands do (--wait-for-deps):
// a deploy's migrate step often starts beside a database that is starting
// too.
func Migrate(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) int {
	name := prog + " migrate"
	fs := NewFlagSet(name, name+" up|down|status [flags]",
		"Applies, rolls back or lists the ledger's schema migrations. Two `migrate up` at once are\n"+
			"safe: a Postgres advisory lock makes the second wait. `down` drops the ledger and needs --yes.", stderr)
	var (
		dbURL string
		yes   bool
		wait  time.Duration
		log   Logging
	)
	RegisterDatabase(fs, &dbURL)
	RegisterWait(fs, &wait)
	log.Register(fs)
	fs.BoolVar(&yes, "yes", false, "confirm `migrate down`, which DROPS every pelguard table")
	verb, rest, err := SplitVerb(fs, args, "up", "down", "status")
	if err != nil {
		return Fail(stderr, name, err)
	}
	if err := Parse(fs, rest); err != nil {
		return Fail(stderr, name, err)
	}
	if fs.NArg() > 0 {
		return Fail(stderr, name, Usagef("unexpected argument %q", fs.Arg(0)))
	}
	if err := ValidateWait(wait); err != nil {
		return Fail(stderr, name, err)
	}
	if verb == "down" && !yes {
		return Fail(stderr, name, Usagef("`migrate down` drops the ledger (billing_records, audit findings): add --yes if you mean it"))
	}
	logger, err := log.Logger(stderr)
	if err != nil {
		return Fail(stderr, name, err)
	}
	pool, dep, err := NewDB(dbURL, 2)
	if err != nil {
		return Fail(stderr, name, err)
	}
	defer pool.Close()
	if err := (Waiter{For: wait, Logger: logger}).Wait(ctx, dep); err != nil {
		return Fail(stderr, name, err)
	}
	m, err := migrations.New(pool, nil)
	if err != nil {
		return Fail(stderr, name, err)
	}
	defer m.Close()
	switch verb {
	case "up":
		v, err := m.Up(ctx)
		if err != nil {
			return Fail(stderr, name, redact.Error(err))
		}
		if len(v) == 0 {
			fmt.Fprintln(stdout, "schema is up to date")
		}
		for _, n := range v {
			fmt.Fprintf(stdout, "applied %05d\n", n)
		}
	case "down":
		v, err := m.Down(ctx)
		if err != nil {
			return Fail(stderr, name, redact.Error(err))
		}
		for _, n := range v {
			fmt.Fprintf(stdout, "rolled back %05d\n", n)
		}
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return Fail(stderr, name, redact.Error(err))
		}
		for _, s := range st {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			fmt.Fprintf(stdout, "%05d  %-8s %s\n", s.Version, state, s.Name)
		}
	}
	return ExitOK
}
