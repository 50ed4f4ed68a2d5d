-- Per-second aggregates of sum meters (internal/meterledger aggregate.go).
--
-- meter_aggregates: one Stripe call carrying the sum of one customer-meter's
-- queued events of one timestamp second. Its identifier (a hash of the
-- namespace, meter, customer, second and its members' identifiers) and
-- its members (meter_events.aggregate) are written in one transaction
-- before its first call and never recomputed; each event belongs to at
-- most one aggregate. An aggregate of unknown outcome is re-sent under the
-- same identifier and value within the safe window of its first attempt,
-- and parked with its members past it, as an event is.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE meter_aggregates (
    identifier         text        PRIMARY KEY CHECK (length(identifier) BETWEEN 1 AND 100),
    stream             text        NOT NULL,
    event_name         text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    second             timestamptz NOT NULL,
    value              bigint      NOT NULL,
    members            integer     NOT NULL CHECK (members >= 1),
    digest             text        NOT NULL,
    status             text        NOT NULL CHECK (status IN ('sending', 'delivered', 'parked', 'failed')),
    first_sent_at      timestamptz NOT NULL,
    attempts           integer     NOT NULL DEFAULT 1,
    outcome_unknown    boolean     NOT NULL DEFAULT false,
    epoch              bigint      NOT NULL CHECK (epoch > 0),
    lease_owner        text,
    lease_expires_at   timestamptz,
    delivered_at       timestamptz,
    last_error         text,
    created_at         timestamptz NOT NULL,
    CONSTRAINT aggregate_lease_only_while_sending CHECK (status = 'sending' OR (lease_owner IS NULL AND lease_expires_at IS NULL))
);
COMMENT ON TABLE meter_aggregates IS 'One Stripe call carrying the sum of a customer-meter''s events of one second; members in meter_events.aggregate.';
CREATE INDEX meter_aggregates_sending_idx ON meter_aggregates (stream, stripe_customer_id, event_name) WHERE status = 'sending';
CREATE INDEX meter_aggregates_second_idx ON meter_aggregates (second);
ALTER TABLE meter_events ADD COLUMN aggregate text;

-- +goose Down
ALTER TABLE meter_events DROP COLUMN aggregate;
DROP TABLE meter_aggregates;
