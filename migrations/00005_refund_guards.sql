-- Refunds that stay right when Stripe changes under them (issue 17).
--
-- refund_ledger: one row per refund pelguard made, whoever asked for it
-- (`auditor refund`, --auto-refund, later a console). The rolling cap
-- (count and cents per 24 h) sums it inside the transaction that records
-- the refund, so two runs in a row cannot together pass the cap. The
-- consumer's ledger writes refuse to record a charge listed here as a key's
-- charge. Unqualified names: migrations run with search_path set to
-- pelguard's schema alone.
--
-- audit_findings.refund_skip_reason: why the last refund attempt left the
-- finding open (the canonical was refunded or disputed, the duplicate
-- changed, a cap, a transient Stripe error), and when.

-- +goose Up
CREATE TABLE refund_ledger (
    id             bigserial   PRIMARY KEY,
    refunded_at    timestamptz NOT NULL,
    charge_id      text        NOT NULL UNIQUE,
    refund_id      text        NOT NULL UNIQUE,
    amount_cents   bigint      NOT NULL CHECK (amount_cents >= 0),
    currency       text        NOT NULL,
    customer_id    text,
    billing_period text,
    finding_id     bigint      REFERENCES audit_findings (id),
    source         text        NOT NULL
);
CREATE INDEX refund_ledger_time_idx ON refund_ledger (refunded_at);

ALTER TABLE audit_findings ADD COLUMN refund_skip_reason text;
ALTER TABLE audit_findings ADD COLUMN refund_skipped_at timestamptz;

-- +goose Down
ALTER TABLE audit_findings DROP COLUMN refund_skipped_at;
ALTER TABLE audit_findings DROP COLUMN refund_skip_reason;
DROP TABLE refund_ledger;
