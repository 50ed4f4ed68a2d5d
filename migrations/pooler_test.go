package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/migrations"
)

// A migration whose transaction does not resolve names to pelguard's
// schema (here: the schema is not there, so current_schema() is NULL) is
// refused, naming the pooler, and creates nothing anywhere.
func TestMigrationRefusedOutsideItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.BareDB(t)
	db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	name := "refused_" + testenv.Suffix()
	err = migrations.InSchema("no_such_schema_"+testenv.Suffix(), "CREATE TABLE "+name+" (id int)")(ctx, tx)
	if !errors.Is(err, migrations.ErrWrongSchema) || !strings.Contains(err.Error(), "pooler") {
		t.Fatalf("migration outside its schema: %v, want ErrWrongSchema naming the pooler", err)
	}
	_ = tx.Rollback()
	var found bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)`, name).Scan(&found); err != nil {
		t.Fatal(err)
	}
	if found {
		t.Fatalf("the refused migration created %s", name)
	}
	// In its schema, the same statements land there and nowhere else.
	schema := testenv.SchemaOf(pool)
	tx2, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.InSchema(schema, "CREATE TABLE "+name+" (id int)")(ctx, tx2); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(); err != nil {
		t.Fatal(err)
	}
	var where string
	if err := pool.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = $1`, name).Scan(&where); err != nil || where != schema {
		t.Fatalf("table in %q (%v), want %s", where, err, schema)
	}
}
