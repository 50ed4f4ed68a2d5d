package refdocs

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/migrations"
)

// Tables renders tables.md from schema, a schema every migration has just
// been applied to: the catalog's tables, columns (type as Postgres prints
// it, NOT NULL, default) and comments. The schema's own name in defaults
// (a sequence's) reads as migrations.DefaultSchema, the name a
// deployment uses unless --db-schema says otherwise.
func Tables(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error) {
	rows, err := pool.Query(ctx, `
SELECT c.relname, coalesce(obj_description(c.oid, 'pg_class'), ''),
       a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(pg_get_expr(d.adbin, d.adrelid), ''), coalesce(col_description(c.oid, a.attnum), '')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
ORDER BY c.relname, a.attnum`, schema)
	if err != nil {
		return "", fmt.Errorf("reading the catalog: %w", err)
	}
	type column struct {
		name, typ, def, comment string
		notNull                 bool
	}
	type table struct {
		name, comment string
		columns       []column
	}
	var tables []*table
	for rows.Next() {
		var t table
		var c column
		if err := rows.Scan(&t.name, &t.comment, &c.name, &c.typ, &c.notNull, &c.def, &c.comment); err != nil {
			rows.Close()
			return "", fmt.Errorf("reading the catalog: %w", err)
		}
		if len(tables) == 0 || tables[len(tables)-1].name != t.name {
			tables = append(tables, &t)
		}
		last := tables[len(tables)-1]
		last.columns = append(last.columns, c)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("reading the catalog: %w", err)
	}
	if len(tables) == 0 {
		return "", fmt.Errorf("no tables in schema %s: are the migrations applied?", schema)
	}
	general := func(s string) string {
		return strings.ReplaceAll(s, schema+".", migrations.DefaultSchema+".")
	}
	var b strings.Builder
	b.WriteString(header("Ledger tables", "a freshly migrated schema's catalog"))
	fmt.Fprintf(&b, "pelguard keeps everything in one Postgres schema of its own (`--db-schema`, default `%s`);\n"+
		"`migrate up` creates these tables there and nothing outside it. `%s` is the migration\n"+
		"tool's bookkeeping (which migrations are applied).\n\n", migrations.DefaultSchema, migrations.VersionTable)
	for _, t := range tables {
		fmt.Fprintf(&b, "- [%s](#%s)\n", t.name, t.name)
	}
	for _, t := range tables {
		fmt.Fprintf(&b, "\n## %s\n\n", t.name)
		if t.comment != "" {
			fmt.Fprintf(&b, "%s\n\n", t.comment)
		}
		b.WriteString("| Column | Type | Null | Default | Comment |\n|---|---|---|---|---|\n")
		for _, c := range t.columns {
			null := "yes"
			if c.notNull {
				null = "not null"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", c.name, cell(c.typ), null, code(general(c.def)), cell(c.comment))
		}
	}
	return b.String(), nil
}
