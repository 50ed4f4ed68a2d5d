-- The team's billing_records, the table the article's code reads and writes.
-- The article prints no DDL; this is the smallest table its statements need:
--   SELECT charge_id, status ... WHERE customer_id = %s AND billing_period = %s
--   INSERT (customer_id, billing_period, charge_id, amount_cents, status, created_at)
--       ... ON CONFLICT (customer_id, billing_period) DO NOTHING
--   INSERT (..., charge_id = NULL, amount_cents, 'card_declined', error, NOW()) on a CardError
-- ON CONFLICT needs the unique constraint; charge_id is NULL for a decline.
-- It is not pelguard's ledger (migrations/00001_ledger.sql), whose table has
-- the same name: keep the two in different schemas.
CREATE TABLE billing_records (
    customer_id    TEXT        NOT NULL,
    billing_period TEXT        NOT NULL,
    charge_id      TEXT,
    amount_cents   BIGINT,
    status         TEXT        NOT NULL,
    error          TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    UNIQUE (customer_id, billing_period)
);
