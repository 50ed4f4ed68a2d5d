package migrations

// LockID is lockID, for tests.
var LockID = lockID
