package pgbouncer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A pooler that exits by itself comes back on the same port, as under the
// supervisor the docs ask for: a test is not failed by PgBouncer 1.18's
// own crash on a cancel request whose client has gone.
func TestAPoolerThatExitsIsRestarted(t *testing.T) {
	t.Parallel()
	b := pgbouncer.Start(t, pgbouncer.Config{PoolSize: 2})
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, b.URL("default_query_exec_mode=exec"))
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var one int
		return c.QueryRow(ctx, "SELECT 1").Scan(&one) == nil && one == 1
	}, "the pooler did not answer again after it was killed")
	if n := b.Restarts(); n != 1 {
		t.Fatalf("restarts = %d, want 1", n)
	}
}
