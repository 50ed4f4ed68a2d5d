package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Per-key advisory locks: "a refund racing a ledger recording". A refund
// holds its key's lock exclusively from the moment it re-reads the ledger
// and Stripe until the refund is recorded; every ledger write that records
// a charge for a key (Finish, FinishCharged, Import) holds the same lock
// shared for its transaction. So the ledger cannot record another canonical
// charge between a refund's last look and its refund, and a write that
// waited sees the refund (refund_ledger) once it gets the lock.
//
// The lock is transaction-level (released at commit or rollback) in the
// single 64-bit key space, which never overlaps the auditor's two-part
// session locks. Its key hashes the schema, the customer and the period:
// two pelguard ledgers in one database never share a key's lock. A hash
// collision only makes two keys wait for each other.
const (
	lockKeyShared = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1 || '/' || u.c || '/' || u.p, 0))
		FROM unnest($2::text[], $3::text[]) AS u(c, p)`
	lockKeyExclusive = `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2 || '/' || $3, 0))`
)

// lockKeysShared takes the shared per-key lock of every key for the rest
// of tx. Shared locks never wait for each other, so their order does not
// matter.
func (l *Ledger) lockKeysShared(ctx context.Context, tx pgx.Tx, keys ...Key) error {
	cust, per := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		cust[i], per[i] = k.CustomerID, k.BillingPeriod
	}
	if _, err := tx.Exec(ctx, lockKeyShared, l.Schema(), cust, per); err != nil {
		return fmt.Errorf("taking the ledger key locks of %d keys: %w", len(keys), err)
	}
	return nil
}

// StripeKey is the lock key of a Stripe customer's billing period: a
// legacy duplicate finding may know only its Stripe customer (no ledger
// row names its team customer), so its refund locks this key too, and every
// ledger write of a charge for that Stripe customer and period takes it
// shared.
func StripeLockKey(stripeCustomerID, period string) Key {
	return Key{CustomerID: "stripe:" + stripeCustomerID, BillingPeriod: period}
}

// LockKey takes k's lock exclusively for the rest of tx, waiting for every
// ledger write of k in progress: what a refund holds from its last look at
// the ledger and Stripe to the recorded refund. tx must be a transaction on
// this ledger's database.
func (l *Ledger) LockKey(ctx context.Context, tx pgx.Tx, k Key) error {
	if _, err := tx.Exec(ctx, lockKeyExclusive, l.Schema(), k.CustomerID, k.BillingPeriod); err != nil {
		return fmt.Errorf("taking the ledger key lock of %s: %w", k, err)
	}
	return nil
}

// Begin starts a transaction on the ledger's database whose statements get
// the schema token, for callers that combine ledger locks with their own
// writes (the auditor's refunds).
func (l *Ledger) Begin(ctx context.Context) (pgx.Tx, error) { return l.pool.Begin(ctx) }

// KeyLockWaiters counts the transactions waiting for k's lock, so a test
// can see a refund or a ledger write blocked on it without sleeping.
func (l *Ledger) KeyLockWaiters(ctx context.Context, k Key) (int, error) {
	var n int
	err := l.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1 || '/' || $2 || '/' || $3, 0)`,
		l.Schema(), k.CustomerID, k.BillingPeriod).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting waiters for the ledger key lock of %s: %w", k, err)
	}
	return n, nil
}
