-- Promises at the edges (issue 25): the ledger's own retries are bounded,
-- and a person's retry of a final failure is recorded.
--
-- redrives: how many times the ledger's retry loop (TakeDue) took a
-- ledger-driven row of the current attempt over after its holder released
-- it (a transient failure, an earlier attempt's intent that could not be
-- closed). Reset when an attempt begins. Each takeover waits twice as long
-- as the one before (1 min up to 1 h); past the budget the row is parked.
-- parked_at, parked_reason: a pending row the ledger stopped retrying by
-- itself (its budget ran out). Still unbilled in the ledger's eyes: an
-- intent that answered 403 may yet move money, so nothing records it charged
-- or failed by guess. Reported as stuck by the auditor and the console;
-- `consumer retry` takes it up again once a person has looked.
-- debit: the row's last final failure was a bank debit (Settle), whose
-- re-presentment NACHA limits; `consumer retry` refuses to re-present it
-- past those limits unless told why (retry_override keeps who said what).
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE billing_records
    ADD COLUMN redrives       integer     NOT NULL DEFAULT 0 CHECK (redrives >= 0),
    ADD COLUMN parked_at      timestamptz,
    ADD COLUMN parked_reason  text,
    ADD COLUMN debit          boolean     NOT NULL DEFAULT false,
    ADD COLUMN retry_override text;

-- A declined row whose failure Settle recorded reads "charge ch_… failed: …".
UPDATE billing_records SET debit = true WHERE status = 'declined' AND last_error LIKE 'charge % failed: %';

CREATE INDEX billing_records_parked_idx ON billing_records (parked_at) WHERE parked_at IS NOT NULL;

-- +goose Down
DROP INDEX billing_records_parked_idx;
ALTER TABLE billing_records
    DROP COLUMN retry_override,
    DROP COLUMN debit,
    DROP COLUMN parked_reason,
    DROP COLUMN parked_at,
    DROP COLUMN redrives;
