-- The reaper in --external-ledger mode (a team that keeps its own consumer
-- and its own billing_records) keeps its own state here, never in the
-- team's table: one lease row per (customer_id, billing_period) it is
-- re-driving, so two reapers never drive the same key at once. Keyed by the
-- business key, not the stream entry: a re-published event carries a fresh
-- stream id. The row goes when the re-drive has written the team's table;
-- one left behind by a crash expires and the next taker asks Stripe first.
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE external_leases (
    customer_id        text        NOT NULL,
    billing_period     text        NOT NULL,
    owner              text        NOT NULL,
    epoch              bigint      NOT NULL DEFAULT 1,
    stream             text        NOT NULL,
    message_id         text        NOT NULL,
    expires_at         timestamptz NOT NULL,
    cap_reserved_cents bigint      NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, billing_period)
);

-- +goose Down
DROP TABLE external_leases;
