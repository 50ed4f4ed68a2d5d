-- How many times a rollback's repair closed it. More evidence of a
-- rollback already repaired (another process's memory held a witness the
-- detection had not seen) re-opens it and the repair runs again: the
-- ledger_repaired alert is sent for the first close, and for a later one
-- only when that pass restored, repaired or found something.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE ledger_rollbacks ADD COLUMN repairs integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE ledger_rollbacks DROP COLUMN repairs;
