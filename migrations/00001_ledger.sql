-- The ledger: one row per (customer_id, billing_period), the source of truth
-- for "has this customer been charged for this period". Redis may lose or
-- repeat deliveries; this table may not. See DESIGN.md "The ledger".

-- +goose Up
CREATE TABLE billing_records (
    customer_id        text        NOT NULL,
    billing_period     text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    amount_cents       bigint      NOT NULL CHECK (amount_cents > 0),
    currency           text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    idempotency_key    text        NOT NULL UNIQUE,
    status             text        NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'charged', 'declined', 'failed')),
    charge_id          text        UNIQUE,
    -- The lease: who may call Stripe for this row right now, until when, and
    -- the fencing epoch every write must present.
    lease_owner        text,
    lease_expires_at   timestamptz,
    epoch              bigint      NOT NULL DEFAULT 1 CHECK (epoch > 0),
    attempts           integer     NOT NULL DEFAULT 1 CHECK (attempts >= 0),
    first_attempt_at   timestamptz NOT NULL,
    last_error         text,
    stream_message_id  text,
    cap_reserved_cents bigint      NOT NULL DEFAULT 0 CHECK (cap_reserved_cents >= 0),
    charged_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, billing_period),
    -- A charge id exists exactly when the row says charged.
    CONSTRAINT charge_id_iff_charged CHECK ((status = 'charged') = (charge_id IS NOT NULL)),
    CONSTRAINT charged_at_iff_charged CHECK ((status = 'charged') = (charged_at IS NOT NULL)),
    -- Terminal rows hold no lease: nobody may act on them any more.
    CONSTRAINT lease_only_when_pending CHECK (status = 'pending' OR (lease_owner IS NULL AND lease_expires_at IS NULL)),
    CONSTRAINT lease_owner_with_expiry CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

-- The auditor's stuck-pending scan and the reaper's pending look-ups.
CREATE INDEX billing_records_pending_idx ON billing_records (lease_expires_at) WHERE status = 'pending';
-- The auditor's range reads of charged rows.
CREATE INDEX billing_records_charged_at_idx ON billing_records (charged_at) WHERE status = 'charged';

-- Spend caps: the seed's "vault key" without a proxy. reserved_cents grows
-- inside the transaction that inserts a pending row and can never pass the cap.
CREATE TABLE spend_caps (
    billing_period text        PRIMARY KEY,
    cap_cents      bigint      NOT NULL CHECK (cap_cents >= 0),
    reserved_cents bigint      NOT NULL DEFAULT 0 CHECK (reserved_cents >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT reserved_within_cap CHECK (reserved_cents <= cap_cents)
);

-- +goose Down
DROP TABLE spend_caps;
DROP TABLE billing_records;
