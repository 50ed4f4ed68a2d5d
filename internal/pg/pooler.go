package pg

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultQueryExecMode is the query mode pelguard uses unless the URL
// names one (default_query_exec_mode=…). pgx's own default,
// cache_statement, prepares named statements on a connection and expects
// to find them there later; behind a transaction-mode pooler (PgBouncer,
// the poolers of Supabase, Neon, Heroku, DigitalOcean) the next
// transaction runs on another server connection, which has never seen the
// name ("prepared statement … does not exist") or already has it from
// another client ("… already exists"). cache_describe prepares only the
// unnamed statement, in the same round trip as its execution once the
// description is cached, so it works through any pooler, and it still
// encodes parameters by the server's types (exec would send a []byte as
// bytea, even into a jsonb column). See docs/operations/connection-pooler.md.
const DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe

// PoolerSafe sets cfg's query mode to DefaultQueryExecMode unless its
// connection string names one. Every pool pelguard opens goes through it.
func PoolerSafe(cfg *pgxpool.Config) {
	if strings.Contains(cfg.ConnString(), "default_query_exec_mode") {
		return // the operator's choice wins
	}
	cfg.ConnConfig.DefaultQueryExecMode = DefaultQueryExecMode
}

// PoolerRefused reports PgBouncer's refusal of a run-time parameter in the
// startup packet (a protocol_violation whose message is its only mark):
// permanent, retrying cannot change it.
func PoolerRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "08P01" && strings.HasPrefix(pe.Message, "unsupported startup parameter")
}

// PoolerHint wraps err with what to do when it is one a connection pooler
// in front of Postgres causes, and returns it unchanged otherwise.
func PoolerHint(err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "42P05" || pe.Code == "26000":
			// duplicate_prepared_statement, invalid_sql_statement_name
			return fmt.Errorf("%w (a transaction-mode connection pooler, such as PgBouncer, hands each transaction "+
				"a different server connection, and named prepared statements do not follow: remove "+
				"default_query_exec_mode from DATABASE_URL, or set it to cache_describe or exec)", err)
		case PoolerRefused(err):
			return fmt.Errorf("%w (a connection pooler, such as PgBouncer, refused a parameter of DATABASE_URL: "+
				"remove search_path and options from the URL and name pelguard's schema with --db-schema "+
				"[PELGUARD_DB_SCHEMA] instead; or add them to the pooler's ignore_startup_parameters)", err)
		}
	}
	return err
}
