-- Findings the auditor closes by itself (issue 17): every run re-checks the
-- open findings it can see, and one whose cause is gone (a late ledger
-- write, a charge that appeared, a duplicate or canonical refunded
-- elsewhere) becomes resolved with the run that resolved it and why. Two
-- new kinds: a dispute on a pelguard charge, and legacy charges that two of
-- the team's customers on one Stripe customer make impossible to tell apart
-- (reported, never refunded). Unqualified names: migrations run with
-- search_path set to pelguard's schema alone.

-- +goose Up
ALTER TABLE audit_findings ADD COLUMN resolved_by_run_id bigint REFERENCES audit_runs (id);
ALTER TABLE audit_findings ADD COLUMN resolution text;
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN (
    'duplicate_charge', 'orphan_charge', 'missing_charge', 'amount_mismatch', 'stuck_pending',
    'disputed', 'ambiguous_legacy'));
-- A finding resolved by a run says why; one resolved by hand names no run.
ALTER TABLE audit_findings ADD CONSTRAINT resolved_by_run_only_when_resolved
    CHECK (resolved_by_run_id IS NULL OR (state = 'resolved' AND resolution IS NOT NULL));
ALTER TABLE audit_runs ADD COLUMN findings_resolved integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE audit_runs DROP COLUMN findings_resolved;
ALTER TABLE audit_findings DROP CONSTRAINT resolved_by_run_only_when_resolved;
DELETE FROM audit_findings WHERE kind IN ('disputed', 'ambiguous_legacy');
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN (
    'duplicate_charge', 'orphan_charge', 'missing_charge', 'amount_mismatch', 'stuck_pending'));
ALTER TABLE audit_findings DROP COLUMN resolution;
ALTER TABLE audit_findings DROP COLUMN resolved_by_run_id;
