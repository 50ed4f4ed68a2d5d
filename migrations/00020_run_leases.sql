-- run_leases: the auditor's run, refund and usage-reconciliation locks, one
-- row per lock. A holder writes its owner and an expiry and renews the
-- expiry (its heartbeat) while it works; whoever finds the expiry passed
-- may take the row over. A lease lives in a table, not in a database
-- session, so a connection pooler that hands the session to someone else
-- (PgBouncer in transaction mode, the managed poolers) can never leave it
-- held, and a holder that was killed frees it when its lease expires.
-- epoch grows with every acquisition: a holder renews and releases only
-- the epoch it took, never its successor's.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE run_leases (
    name         text        PRIMARY KEY,
    owner        text,
    epoch        bigint      NOT NULL DEFAULT 1,
    acquired_at  timestamptz,
    heartbeat_at timestamptz,
    expires_at   timestamptz,
    CHECK ((owner IS NULL) = (expires_at IS NULL))
);
COMMENT ON TABLE run_leases IS 'The auditor''s run, refund and usage-reconciliation locks as leases: owner, expiry and heartbeat; an expired lease may be taken over (package audit, lease.go).';

-- +goose Down
DROP TABLE run_leases;
