package audit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Advisory lock keys. Runs and refunds take different locks: a refund may
// run while a scheduled run lists Stripe, but two runs (which would both
// count the same new findings and alert twice) or two refund runs (which
// would race for the same caps) may not. Advisory locks are per database,
// so the first half of the two-part key is the hash of pelguard's schema: two pelguard
// ledgers in one database (one per schema, as every test has) audit
// independently.
const (
	lockRun    int32 = 0x70676101 // "pga" run
	lockRefund int32 = 0x70676102 // "pga" refund
)

// heldLock is a session advisory lock on a dedicated connection: session
// locks belong to the connection, so it must not return to the pool while
// held.
type heldLock struct {
	conn   *pgxpool.Conn
	schema string
	key    int32
}

// acquireLock takes key, waiting up to wait (0: not at all). It returns
// ErrLocked when someone else still holds it.
func acquireLock(ctx context.Context, pool *pgxpool.Pool, schema string, key int32, wait time.Duration) (*heldLock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring a connection for the audit lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($2), $1)`, key, schema).Scan(&ok); err != nil {
			conn.Release()
			return nil, fmt.Errorf("taking the audit lock: %w", err)
		}
		if ok {
			return &heldLock{conn: conn, schema: schema, key: key}, nil
		}
		if !time.Now().Before(deadline) {
			conn.Release()
			return nil, ErrLocked
		}
		// Polling rather than a blocking pg_advisory_lock: cancelling a
		// blocked query makes pgx close the connection, and a poll also
		// honours the deadline exactly.
		t := time.NewTimer(min(time.Until(deadline), 200*time.Millisecond+rand.N(100*time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			conn.Release()
			return nil, fmt.Errorf("waiting for the audit lock: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// release unlocks and returns the connection. If the unlock fails the
// connection is closed instead, which releases the lock server-side.
func (l *heldLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($2), $1)`, l.key, l.schema); err != nil {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}
