package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
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
	fs := NewFlagSet(name, name+" up|down|status|move [flags]",
		"Applies, rolls back or lists the ledger's schema migrations, in pelguard's own schema\n"+
			"(--db-schema, default pelguard; `up` creates it). Nothing outside that schema is created,\n"+
			"altered or dropped: each migration sets search_path in its own transaction and checks it,\n"+
			"so it lands there through a connection pooler too. Two `migrate up` at once are safe: a\n"+
			"lock row in that schema makes the second wait. `down` drops pelguard's tables and needs --yes. `status` writes nothing.\n"+
			"`move --from public` moves a ledger an earlier version made in public into --db-schema,\n"+
			"in one transaction, after checking that the tables there are pelguard's.", stderr)
	var (
		dbURL, schema, from string
		yes                 bool
		wait                time.Duration
		log                 Logging
	)
	RegisterDatabase(fs, &dbURL)
	RegisterSchema(fs, &schema)
	fs.StringVar(&from, "from", "", "with 'migrate move': the schema an earlier version left pelguard's tables in (public)")
	RegisterWait(fs, &wait)
	log.Register(fs)
	fs.BoolVar(&yes, "yes", false, "confirm 'migrate down', which DROPS every pelguard table")
	verb, rest, err := SplitVerb(fs, args, "up", "down", "status", "move")
	if err != nil {
		return Fail(stderr, name, err)
	}
	if err := ParseFlags(fs, rest); err != nil {
		return Fail(stderr, name, err)
	}
	if err := ValidateWait(wait); err != nil {
		return Fail(stderr, name, err)
	}
	if verb == "move" && from == "" {
		return Fail(stderr, name, Usagef("`migrate move` needs --from SCHEMA (where the earlier version put pelguard's tables, usually public)"))
	}
	if err := CheckSchemaFlag(dbURL, schema); err != nil {
		return Fail(stderr, name, err)
	}
	if verb == "down" && !yes {
		return Fail(stderr, name, Usagef("`migrate down` drops pelguard's tables in schema %s (the ledger, audit findings): add --yes if you mean it", schema))
	}
	logger, err := log.Logger(stderr)
	if err != nil {
		return Fail(stderr, name, err)
	}
	RouteLibraryLogs(logger)
	pool, dep, err := NewDB(dbURL, 2)
	if err != nil {
		return Fail(stderr, name, err)
	}
	defer pool.Close()
	if err := (Waiter{For: wait, Logger: logger}).Wait(ctx, dep); err != nil {
		return Fail(stderr, name, err)
	}
	if verb == "move" {
		moved, err := migrations.MoveSchema(ctx, pool, from, schema)
		if err != nil {
			return Fail(stderr, name, redact.Error(err))
		}
		for _, t := range moved {
			fmt.Fprintf(stdout, "moved %s.%s to %s.%s\n", from, t, schema, t)
		}
		return ExitOK
	}
	state, err := migrations.Check(ctx, pool, schema)
	if err != nil {
		return Fail(stderr, name, redact.Error(err))
	}
	if verb == "up" && state.LegacySchema != "" {
		// Never an empty second ledger beside the real one.
		return Fail(stderr, name, Usagef("%v", state.Err(prog)))
	}
	if verb == "down" && !slices.ContainsFunc(state.Migrations, func(s migrations.Status) bool { return s.Applied }) {
		fmt.Fprintf(stdout, "schema %s has no applied migration: nothing to roll back\n", schema)
		return ExitOK
	}
	m, err := migrations.New(pool, schema, nil)
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
			fmt.Fprintf(stdout, "schema %s is up to date\n", schema)
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
