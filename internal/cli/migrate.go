package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/migrations"
)

// Migrate runs `<prog> migrate up|down|status`. It returns an exit code.
func Migrate(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) int {
	fs := NewFlagSet(prog+" migrate", prog+" migrate up|down|status [flags]",
		"Applies, rolls back or lists the ledger's schema migrations. Two `migrate up` at once are\n"+
			"safe: a Postgres advisory lock makes the second wait. `down` drops the ledger and needs --yes.", stderr)
	var dbURL string
	var yes bool
	RegisterDatabase(fs, &dbURL)
	fs.BoolVar(&yes, "yes", false, "confirm `migrate down`, which DROPS every pelguard table")
	if len(args) == 0 {
		fs.Usage()
		return ExitError
	}
	verb := args[0]
	if err := Parse(fs, args[1:]); err != nil {
		return Fail(stderr, prog+" migrate", err)
	}
	if verb != "up" && verb != "down" && verb != "status" {
		return Fail(stderr, prog+" migrate", Usagef("unknown migrate command %q: want up, down or status", verb))
	}
	if verb == "down" && !yes {
		return Fail(stderr, prog+" migrate", Usagef("`migrate down` drops the ledger (billing_records, audit findings): add --yes if you mean it"))
	}
	pool, err := pg.Open(ctx, dbURL, 2)
	if err != nil {
		return Fail(stderr, prog+" migrate", err)
	}
	defer pool.Close()
	m, err := migrations.New(pool, nil)
	if err != nil {
		return Fail(stderr, prog+" migrate", err)
	}
	defer m.Close()
	switch verb {
	case "up":
		v, err := m.Up(ctx)
		if err != nil {
			return Fail(stderr, prog+" migrate", redact.Error(err))
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
			return Fail(stderr, prog+" migrate", redact.Error(err))
		}
		for _, n := range v {
			fmt.Fprintf(stdout, "rolled back %05d\n", n)
		}
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return Fail(stderr, prog+" migrate", redact.Error(err))
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
