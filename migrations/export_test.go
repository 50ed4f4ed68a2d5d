package migrations

import "context"

// LockID is lockID, for tests.
var LockID = lockID

// UpTo applies the migrations up to version v, for tests of a later
// migration's back-fill.
func (m *Migrator) UpTo(ctx context.Context, v int64) error {
	_, err := m.provider.UpTo(ctx, v)
	return err
}
