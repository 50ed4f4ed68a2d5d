package migrations

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"
)

// LockID is lockID, for tests.
var LockID = lockID

// UpTo applies the migrations up to version v, for tests of a later
// migration's back-fill.
func (m *Migrator) UpTo(ctx context.Context, v int64) error {
	_, err := m.provider.UpTo(ctx, v)
	return err
}

// HoldLock takes schema's migration lock as another `migrate up` would
// (the schema must exist), until the returned func is called.
func HoldLock(ctx context.Context, pool *pgxpool.Pool, schema string) (func(), error) {
	l, err := lock.NewPostgresTableLocker(lock.WithTableName(schema+"."+LockTable), lock.WithTableLockID(lockID(schema)),
		lock.WithTableLockTimeout(100*time.Millisecond, 10))
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	if err := l.Lock(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	return func() { _ = l.Unlock(context.Background(), db); _ = db.Close() }, nil
}

// InSchema is inSchema, for tests.
var InSchema = inSchema
