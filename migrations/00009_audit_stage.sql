-- The auditor's working set (issue 18): a run streams the charges it lists
-- into audit_stage, one page of 100 at a time with COPY, and reads them back
-- grouped by ledger key, so its memory does not grow with the window (a
-- month-end window holds a million charges). Rows belong to one run
-- (run_id); the run deletes its own at the end, and a run holding the run
-- lock deletes what a crashed run left. UNLOGGED: nothing here outlives a
-- run's purpose, so it is not worth the WAL; after a crash Postgres empties
-- it, which is exactly what a crashed run's rows deserve.
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE UNLOGGED TABLE audit_stage (
    run_id             bigint   NOT NULL,
    -- grp: 1 a pelguard charge (marked, or recorded by a ledger row), filed
    -- under its ledger key; 2 a marked charge without customer/period
    -- metadata (an orphan); 3 any other succeeded charge, which only proves
    -- a ledger row's charge exists; 4 a pending charge (money in motion, see
    -- audit_pending); 5 a failed charge.
    grp                smallint NOT NULL,
    charge_id          text     NOT NULL,
    payment_intent_id  text,
    customer_id        text     NOT NULL DEFAULT '',
    billing_period     text     NOT NULL DEFAULT '',
    stripe_customer_id text     NOT NULL DEFAULT '',
    idempotency_key    text     NOT NULL DEFAULT '',
    created            bigint   NOT NULL,
    amount_cents       bigint   NOT NULL,
    refunded_cents     bigint   NOT NULL DEFAULT 0,
    currency           text     NOT NULL DEFAULT '',
    disputed           boolean  NOT NULL DEFAULT false
);
-- The missing_charge anti-joins probe the stage by charge id and by intent
-- id: with these, no plan (billing_records' statistics may be stale) costs
-- more than one index probe per ledger row of the window.
CREATE INDEX audit_stage_charge ON audit_stage (run_id, charge_id);
CREATE INDEX audit_stage_intent ON audit_stage (run_id, payment_intent_id) WHERE payment_intent_id IS NOT NULL;

-- Money in motion (issue 21): a bank debit's charge stays "pending" for days.
-- A run that lists one remembers it here instead of judging it, and every
-- later run reads it again at Stripe (GET /v1/charges/{id}) until it is final,
-- then judges it as if its window had listed it (a succeeded one joins its
-- key's group; a failed one is dropped, and a ledger row claiming it charged
-- is missing_charge). So a window is re-checked until every charge in it is
-- final. Logged: forgetting a pending charge would be forgetting a possible
-- duplicate.
CREATE TABLE audit_pending (
    charge_id    text        PRIMARY KEY,
    created      timestamptz NOT NULL,
    first_run_id bigint      NOT NULL,
    last_run_id  bigint      NOT NULL,
    checked_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE audit_pending;
DROP TABLE audit_stage;
