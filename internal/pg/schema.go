package pg

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is where pelguard keeps its tables unless told otherwise.
const DefaultSchema = "pelguard"

// SchemaToken stands for pelguard's schema in every SQL statement pelguard
// runs: `INSERT INTO {schema}.billing_records …`. DB and Tx replace it with
// the quoted schema name, so no unqualified table name of pelguard's can
// resolve through search_path to a table of the team's (a team's own
// billing_records in public, say).
const SchemaToken = "{schema}"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidSchema reports whether name is a schema name pelguard accepts: lower
// case letters, digits and underscores, so that it never needs quoting in a
// command a person copies.
func ValidSchema(name string) error {
	if !schemaName.MatchString(name) {
		return fmt.Errorf("schema %q: want lower-case letters, digits and _ (at most 63, not starting with a digit)", name)
	}
	if strings.HasPrefix(name, "pg_") || name == "information_schema" {
		return fmt.Errorf("schema %q is reserved by Postgres", name)
	}
	return nil
}

// DB is a pool whose Exec, Query, QueryRow, Begin and CopyFrom put pelguard's
// schema in place of SchemaToken. Everything else is the pool's own.
type DB struct {
	*pgxpool.Pool
	schema string
	quoted string
}

// NewDB wraps pool for schema (empty: DefaultSchema). The name is checked
// with ValidSchema; callers validate their Config first, so a bad name here
// is a programming error and panics.
func NewDB(pool *pgxpool.Pool, schema string) DB {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidSchema(schema); err != nil {
		panic(err)
	}
	return DB{Pool: pool, schema: schema, quoted: pgx.Identifier{schema}.Sanitize()}
}

// Schema is the schema's name.
func (d DB) Schema() string { return d.schema }

// SQL returns q with SchemaToken replaced.
func (d DB) SQL(q string) string { return strings.ReplaceAll(q, SchemaToken, d.quoted) }

// Exec runs q with the schema in place.
func (d DB) Exec(ctx context.Context, q string, args ...any) (pgconn.CommandTag, error) {
	return d.Pool.Exec(ctx, d.SQL(q), args...)
}

// Query runs q with the schema in place.
func (d DB) Query(ctx context.Context, q string, args ...any) (pgx.Rows, error) {
	return d.Pool.Query(ctx, d.SQL(q), args...)
}

// QueryRow runs q with the schema in place.
func (d DB) QueryRow(ctx context.Context, q string, args ...any) pgx.Row {
	return d.Pool.QueryRow(ctx, d.SQL(q), args...)
}

// Begin starts a transaction whose statements get the schema too.
func (d DB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return Tx{Tx: tx, db: d}, nil
}

// BeginTx is Begin with options.
func (d DB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.Pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return Tx{Tx: tx, db: d}, nil
}

// CopyFrom copies into table (a bare name) in the schema.
func (d DB) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return d.Pool.CopyFrom(ctx, d.qualify(table), cols, src)
}

func (d DB) qualify(table pgx.Identifier) pgx.Identifier {
	if len(table) == 1 {
		return pgx.Identifier{d.schema, table[0]}
	}
	return table
}

// WrapTx makes a transaction begun elsewhere (on a bare connection) put
// the schema in its statements, as Begin's do.
func (d DB) WrapTx(tx pgx.Tx) pgx.Tx { return Tx{Tx: tx, db: d} }

// Tx is a transaction of a DB: its statements get the schema as well.
type Tx struct {
	pgx.Tx
	db DB
}

// Exec runs q with the schema in place.
func (t Tx) Exec(ctx context.Context, q string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, t.db.SQL(q), args...)
}

// Query runs q with the schema in place.
func (t Tx) Query(ctx context.Context, q string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, t.db.SQL(q), args...)
}

// QueryRow runs q with the schema in place.
func (t Tx) QueryRow(ctx context.Context, q string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, t.db.SQL(q), args...)
}

// CopyFrom copies into table (a bare name) in the schema.
func (t Tx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return t.Tx.CopyFrom(ctx, t.db.qualify(table), cols, src)
}

// Begin starts a savepoint that keeps the schema.
func (t Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return Tx{Tx: tx, db: t.db}, nil
}

// SearchPath is the search_path a connection's run-time parameters set
// (`?search_path=x` or `?options=-csearch_path=x`), unquoted and trimmed.
func SearchPath(params map[string]string) (string, bool) {
	if sp, ok := params["search_path"]; ok {
		return cleanPath(sp), true
	}
	for _, o := range strings.Fields(params["options"]) {
		o = strings.TrimPrefix(strings.TrimPrefix(o, "-c"), "--")
		if v, ok := strings.CutPrefix(o, "search_path="); ok {
			return cleanPath(v), true
		}
	}
	return "", false
}

func cleanPath(s string) string {
	return strings.Trim(strings.ReplaceAll(strings.TrimSpace(s), " ", ""), `"`)
}

// TeamTable parses the schema-qualified name of a team's own table
// (--from-table, --external-ledger): both parts are required, since an
// unqualified name would resolve through search_path, possibly to a
// table of pelguard's own of the same name. flag names the option in the
// error.
func TeamTable(flag, name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) != 2 || strings.TrimSpace(parts[0]) == "" || strings.TrimSpace(parts[1]) == "" {
		return nil, fmt.Errorf("%s %q: want a schema-qualified table name, such as public.billing_records", flag, name)
	}
	return pgx.Identifier(parts), nil
}
