package pgbouncer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/pgbouncer"
	"github.com/pelguard/pelguard/internal/testkit/pgfailover"
)

// A client connection to the pooler outlives a failover: after the primary
// dies and the pooler is re-pointed at the promoted replica, the same
// client connection's next transaction runs on the new primary, with no
// new connection from the client's side.
func TestRepointKeepsClientConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := pgfailover.Start(t, pgfailover.Options{})
	b := pgbouncer.Start(t, pgbouncer.Config{Server: cl.Primary().URL(), PoolSize: 2})
	conn, err := pgx.Connect(ctx, b.URL("default_query_exec_mode=exec"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	port := func() (p int, err error) {
		err = conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&p)
		return p, err
	}
	if p, err := port(); err != nil || p != cl.Primary().Port {
		t.Fatalf("before the failover: port %d (%v), want the primary's %d", p, err, cl.Primary().Port)
	}
	if err := cl.StallReplication(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int)"); err != nil { // lost by the failover
		t.Fatal(err)
	}
	if _, err := cl.FailoverLosingCommits(ctx); err != nil {
		t.Fatal(err)
	}
	b.Repoint(t, cl.Primary().Addr())
	p, err := port()
	if err != nil || p != cl.Primary().Port {
		t.Fatalf("after the failover and repoint, the client's connection: port %d (%v), want the promoted replica's %d", p, err, cl.Primary().Port)
	}
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("the connection's server is in recovery: %v (%v)", inRecovery, err)
	}
}
