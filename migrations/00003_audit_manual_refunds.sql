-- The auditor's checkpoint must ignore runs over a window an operator chose
-- (--from/--to/--period): a manual run over last year must not move the
-- scheduled runs' starting point. Refunds record how much was refunded and
-- when, for the finance team's reconciliation.

-- +goose Up
ALTER TABLE audit_runs ADD COLUMN manual boolean NOT NULL DEFAULT false;
ALTER TABLE audit_findings ADD COLUMN refunded_cents bigint;
ALTER TABLE audit_findings ADD COLUMN refunded_at timestamptz;
DROP INDEX audit_runs_ok_idx;
CREATE INDEX audit_runs_checkpoint_idx ON audit_runs (window_to DESC) WHERE status = 'ok' AND NOT manual;

-- +goose Down
DROP INDEX audit_runs_checkpoint_idx;
CREATE INDEX audit_runs_ok_idx ON audit_runs (window_to DESC) WHERE status = 'ok';
ALTER TABLE audit_findings DROP COLUMN refunded_at;
ALTER TABLE audit_findings DROP COLUMN refunded_cents;
ALTER TABLE audit_runs DROP COLUMN manual;
