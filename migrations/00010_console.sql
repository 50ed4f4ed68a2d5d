-- The console (pelguard-console, issue 20): every action a person takes in
-- it — a refund, a dismissal, a resolution, a dead-letter replay — is one
-- row here, with who, when, what and why, written before the action runs
-- and finished with its outcome. token is the one-time token of the
-- confirmation form the action came from: a double submit (a second click,
-- a browser retry) finds its row and does nothing a second time.
--
-- The indexes serve the console's pages over large tables: findings by
-- state, customer or period (newest first), the open findings' counts and
-- amounts by kind, and the ledger's counts and amounts per billing period
-- and status. The two counting indexes carry the amounts (INCLUDE), so the
-- overview sums a period of 100,000 rows from the index alone instead of
-- reading every heap page of the period. Unqualified names: migrations run
-- with search_path set to pelguard's schema alone.

-- +goose Up
CREATE TABLE console_actions (
    id          bigserial   PRIMARY KEY,
    token       text        NOT NULL UNIQUE,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL CHECK (actor <> ''),
    action      text        NOT NULL CHECK (action IN ('refund', 'dismiss', 'resolve', 'replay', 'replay_reason')),
    target      text        NOT NULL,
    reason      text        NOT NULL CHECK (btrim(reason) <> ''),
    remote_addr text,
    outcome     text        NOT NULL DEFAULT 'started' CHECK (outcome IN ('started', 'done', 'refused', 'failed')),
    detail      text        NOT NULL DEFAULT '',
    finished_at timestamptz
);

CREATE INDEX audit_findings_state_id_idx ON audit_findings (state, id);
CREATE INDEX audit_findings_customer_idx ON audit_findings (customer_id, billing_period, id);
CREATE INDEX audit_findings_period_idx ON audit_findings (billing_period, id);
CREATE INDEX billing_records_period_status_idx ON billing_records (billing_period, status) INCLUDE (currency, amount_cents);
CREATE INDEX audit_findings_open_kind_idx ON audit_findings (kind, currency) INCLUDE (amount_cents) WHERE state = 'open';

-- +goose Down
DROP INDEX audit_findings_open_kind_idx;
DROP INDEX billing_records_period_status_idx;
DROP INDEX audit_findings_period_idx;
DROP INDEX audit_findings_customer_idx;
DROP INDEX audit_findings_state_id_idx;
DROP TABLE console_actions;
