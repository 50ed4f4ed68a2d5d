package pgfailover_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/testkit/pgfailover"
)

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func insertRows(t *testing.T, ctx context.Context, conn *pgx.Conn, phase string, n int) {
	t.Helper()
	for i := range n {
		// One transaction per row: each is a separate commit the primary acknowledged.
		if _, err := conn.Exec(ctx, "INSERT INTO ledger_rows (phase, i) VALUES ($1, $2)", phase, i); err != nil {
			t.Fatalf("insert %s row %d: %v", phase, i, err)
		}
	}
}

func count(t *testing.T, ctx context.Context, conn *pgx.Conn, phase string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ledger_rows WHERE phase = $1", phase).Scan(&n); err != nil {
		t.Fatalf("counting %s rows: %v", phase, err)
	}
	return n
}

// The drill issue 26 needs: commits the primary acknowledged while the
// asynchronous replica received nothing are gone after the failover, the
// timeline moved on, and the promoted server takes writes at the same URL.
func TestFailoverLosingCommitsLosesTheStalledCommits(t *testing.T) {
	t.Parallel()
	c := pgfailover.Start(t, pgfailover.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	db := connect(t, ctx, c.URL())
	if _, err := db.Exec(ctx, "CREATE TABLE ledger_rows (id bigserial PRIMARY KEY, phase text NOT NULL, i int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	settings, err := pgfailover.ReplicationSettings(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if !settings.Asynchronous() || settings.SynchronousStandbyNames != "" || settings.SynchronousCommit != "on" {
		t.Fatalf("primary's replication settings %+v, want synchronous_commit=on and no synchronous standby (asynchronous)", settings)
	}
	tliBefore, err := pgfailover.TimelineID(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	lsnBefore, err := pgfailover.CurrentWALLSN(ctx, db)
	if err != nil {
		t.Fatal(err)
	}

	const kept, lost = 20, 15
	insertRows(t, ctx, db, "before-stall", kept)
	if err := c.StallReplication(ctx); err != nil {
		t.Fatal(err)
	}
	insertRows(t, ctx, db, "during-stall", lost)
	if got := count(t, ctx, db, "during-stall"); got != lost {
		t.Fatalf("the primary shows %d rows written during the stall, want %d committed", got, lost)
	}
	lsnStalled, err := pgfailover.CurrentWALLSN(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if lsnStalled <= lsnBefore {
		t.Fatalf("the primary's WAL did not advance: %v then %v", lsnBefore, lsnStalled)
	}

	loss, err := c.FailoverLosingCommits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if loss.Bytes() == 0 || loss.PrimaryXID == loss.ReplicaXID {
		t.Errorf("loss %+v: want the primary ahead of the replica", loss)
	}
	if c.Replica() != nil || c.Primary().Name != "replica" {
		t.Errorf("after failover the primary is the %q and a replica remains: %v", c.Primary().Name, c.Replica() != nil)
	}

	// The old connection went with the old primary (as with a moved VIP).
	if _, err := db.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a connection made before the failover still works; it should have been cut")
	}
	db2 := connect(t, ctx, c.URL())
	if got := count(t, ctx, db2, "before-stall"); got != kept {
		t.Errorf("rows written before the stall after failover: %d, want %d (replicated)", got, kept)
	}
	if got := count(t, ctx, db2, "during-stall"); got != 0 {
		t.Errorf("rows written during the stall after failover: %d, want 0 (never replicated, lost)", got)
	}
	tliAfter, err := pgfailover.TimelineID(ctx, db2)
	if err != nil {
		t.Fatal(err)
	}
	if tliAfter <= tliBefore {
		t.Errorf("timeline %d after failover, want above %d", tliAfter, tliBefore)
	}
	var inRecovery bool
	if err := db2.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("the server behind URL is in recovery (%v, %v), want the promoted primary", inRecovery, err)
	}
	insertRows(t, ctx, db2, "after-failover", 3)
	if got := count(t, ctx, db2, "after-failover"); got != 3 {
		t.Errorf("rows written after failover: %d, want 3", got)
	}
	// The promoted primary's WAL continues from what it received, which is
	// behind where the old primary had got to: the product's detection can
	// compare the two positions.
	lsnAfter, err := pgfailover.CurrentWALLSN(ctx, db2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timeline %d -> %d; primary had written %v, replica had %v (%d bytes lost, xid %d vs %d); new primary now at %v",
		tliBefore, tliAfter, loss.PrimaryLSN, loss.ReplicaLSN, loss.Bytes(), loss.PrimaryXID, loss.ReplicaXID, lsnAfter)
}

// A failover drill that would lose nothing refuses, so a test of loss
// detection cannot pass against a failover that lost no commit; replication
// resumed after a stall catches the replica up; and when the test ends both
// servers have exited, the relay no longer answers and the directory is gone.
func TestFailoverLosingCommitsRefusesWhenNothingWouldBeLostAndCleansUp(t *testing.T) {
	t.Parallel()
	var c *pgfailover.Cluster
	t.Run("drill", func(t *testing.T) {
		c = pgfailover.Start(t, pgfailover.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		db := connect(t, ctx, c.URL())
		if _, err := db.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
		if err := c.StallReplication(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		c.ResumeReplication()
		if err := c.WaitReplicaCaughtUp(ctx); err != nil {
			t.Fatalf("after ResumeReplication: %v", err)
		}
		replica := connect(t, ctx, c.Replica().URL())
		var n int
		if err := replica.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
			t.Fatalf("replica has %d rows (%v) after resuming, want 1", n, err)
		}
		if err := c.StallReplication(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.FailoverLosingCommits(ctx); !errors.Is(err, pgfailover.ErrNothingLost) {
			t.Fatalf("FailoverLosingCommits with nothing to lose: %v, want ErrNothingLost", err)
		}
		if !c.Primary().Running() || c.Primary().Name != "primary" {
			t.Error("the refused drill touched the primary")
		}
	})
	if c == nil {
		return // skipped: no server binaries
	}
	primary, replica := c.Primary(), c.Replica()
	for _, n := range []*pgfailover.Node{primary, replica} {
		if n.Running() {
			t.Errorf("the %s is still running after the test's cleanup", n.Name)
		}
		if _, err := os.Stat(n.DataDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the %s's data dir %s remains after cleanup (%v)", n.Name, n.DataDir, err)
		}
	}
	u, err := url.Parse(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second); err == nil {
		_ = conn.Close()
		t.Errorf("the relay at %s still accepts connections after cleanup", u.Host)
	}
}
