-- Usage events sent to Stripe Billing Meters (issue 28), counted exactly
-- once: the ledger of what was sent, read before every send and written
-- before every XACK, as billing_records is for charges. Package
-- internal/meterledger is the only code that reads or writes these tables.
--
-- meter_events: one row per event (its identifier, derived from business
-- fields only). Partitioned by day of the event's timestamp: Stripe refuses
-- events older than 35 days, so a day's partition is dropped whole once it
-- is older than 36 days (no DELETE, no vacuum debt). The partitions are made
-- by meterledger's EnsurePartitions ([now - 36 d, now + 2 d]), not here: there
-- is no default partition, so a row outside them cannot be written at all.
-- Besides the primary key, one small partial index holds the events still
-- sending (in flight, or of unknown outcome): the rollback fence, the
-- reaper's and the console's look at them without reading the delivered.
--
-- meter_inflight: Stripe allows one concurrent call per customer per meter.
-- One slot per (customer, meter), taken with the lease in the reservation,
-- freed by the finish, expiring with the lease: two events of one customer
-- and meter are never in flight at once across the fleet.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE meter_events (
    event_ts           timestamptz NOT NULL,
    identifier         text        NOT NULL CHECK (length(identifier) BETWEEN 1 AND 100),
    event_name         text        NOT NULL CHECK (length(event_name) BETWEEN 1 AND 100),
    stripe_customer_id text        NOT NULL,
    customer_id        text,
    value              bigint      NOT NULL,
    status             text        NOT NULL DEFAULT 'sending'
                       CHECK (status IN ('sending', 'delivered', 'parked', 'failed')),
    -- The first attempt: Stripe refuses a repeated identifier for at least
    -- 24 hours after receiving it, so an unknown outcome is re-sent only
    -- within the safe window (23 h) of this time, and parked after.
    first_sent_at      timestamptz NOT NULL,
    attempts           integer     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    epoch              bigint      NOT NULL CHECK (epoch > 0),
    lease_owner        text,
    lease_expires_at   timestamptz,
    delivered_at       timestamptz,
    last_error         text,
    stream_message_id  text,
    created_at         timestamptz NOT NULL,
    PRIMARY KEY (event_ts, identifier),
    CONSTRAINT lease_only_while_sending CHECK (status = 'sending' OR (lease_owner IS NULL AND lease_expires_at IS NULL)),
    CONSTRAINT lease_owner_with_expiry CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT delivered_at_iff_delivered CHECK ((status = 'delivered') = (delivered_at IS NOT NULL)),
    -- A parked or failed event says why: an operator acts on it.
    CONSTRAINT reason_when_stopped CHECK (status NOT IN ('parked', 'failed') OR last_error IS NOT NULL)
) PARTITION BY RANGE (event_ts);
COMMENT ON TABLE meter_events IS 'Meter events sent to Stripe, one row per identifier; daily partitions by event_ts, kept 36 days (internal/meterledger).';
CREATE INDEX meter_events_sending_idx ON meter_events (first_sent_at) WHERE status = 'sending';
COMMENT ON COLUMN meter_events.first_sent_at IS 'The first attempt; an unknown outcome is re-sent only within the safe window (23 h) of it.';

CREATE TABLE meter_inflight (
    stripe_customer_id text        NOT NULL,
    event_name         text        NOT NULL,
    identifier         text        NOT NULL,
    event_ts           timestamptz NOT NULL,
    owner              text        NOT NULL,
    expires_at         timestamptz NOT NULL,
    -- Names this grant of the slot: the holder's finish, release and
    -- heartbeat present it, so a holder whose slot expired and was taken
    -- never frees or renews the next holder's.
    token              bigint      NOT NULL CHECK (token <> 0),
    PRIMARY KEY (stripe_customer_id, event_name)
);
COMMENT ON TABLE meter_inflight IS 'One slot per Stripe customer and meter: the event in flight at Stripe (one concurrent call per customer per meter).';

-- +goose Down
DROP TABLE meter_inflight;
DROP TABLE meter_events;
