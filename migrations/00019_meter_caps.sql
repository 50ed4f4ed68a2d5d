-- Spend caps for meter events (issue 28), in the meter's own units: how
-- much of a meter one Stripe customer may be sent per calendar month (UTC,
-- by the event's timestamp), the meter counterpart of spend_caps. Package
-- internal/meterledger is the only code that reads or writes these tables.
--
-- meter_usage: per meter, Stripe customer and month, what may count at
-- Stripe: the values (units) and the number (events) of the events recorded
-- sending, delivered or parked. Kept for every customer, capped or not, so
-- a cap set mid-month starts from what the customer already used. The
-- reservation that writes an event's row adds its value in the same
-- statement, and only while the cap allows it; a Failed outcome (Stripe
-- refused the event: it counts nothing) takes it back in the statement that
-- records it. One row per customer and month: a few bytes per customer, not
-- per event. The current month's and the 12 before are kept; older ones are
-- pruned with the partitions.
--
-- meter_caps: the caps. stripe_customer_id '*' is every customer of the
-- meter without a cap of its own (each customer counted separately), month
-- '*' is every month; the most specific cap applies (customer before '*',
-- then month before '*'). counts says what a cap bounds: the sum of the
-- values ('units', for sum meters) or the number of events ('events', for
-- count meters, whose values Stripe ignores).
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE meter_usage (
    event_name         text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    month              date        NOT NULL CHECK (extract(day FROM month) = 1),
    units              bigint      NOT NULL DEFAULT 0,
    events             bigint      NOT NULL DEFAULT 0 CHECK (events >= 0),
    updated_at         timestamptz NOT NULL,
    PRIMARY KEY (event_name, stripe_customer_id, month)
);
-- The console finds a customer's meters by its Stripe id (search, Usage).
CREATE INDEX meter_usage_customer_idx ON meter_usage (stripe_customer_id, month);
COMMENT ON TABLE meter_usage IS 'Per meter, Stripe customer and month (UTC): the units and events recorded sending, delivered or parked; what meter caps are checked against (internal/meterledger).';

CREATE TABLE meter_caps (
    event_name         text        NOT NULL CHECK (length(event_name) BETWEEN 1 AND 100),
    stripe_customer_id text        NOT NULL CHECK (length(stripe_customer_id) BETWEEN 1 AND 255),
    month              text        NOT NULL CHECK (month = '*' OR month ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    cap                bigint      NOT NULL CHECK (cap >= 0),
    counts             text        NOT NULL DEFAULT 'units' CHECK (counts IN ('units', 'events')),
    updated_at         timestamptz NOT NULL,
    PRIMARY KEY (event_name, stripe_customer_id, month)
);
COMMENT ON TABLE meter_caps IS 'Meter spend caps per meter, Stripe customer (* every customer) and month (YYYY-MM, * every month); the most specific applies.';

-- What the events already in the ledger used (sending, delivered, parked).
INSERT INTO meter_usage (event_name, stripe_customer_id, month, units, events, updated_at)
SELECT event_name, stripe_customer_id, date_trunc('month', event_ts AT TIME ZONE 'UTC')::date, sum(value), count(*), now()
FROM meter_events WHERE status <> 'failed'
GROUP BY 1, 2, 3;

-- +goose Down
DROP TABLE meter_caps;
DROP TABLE meter_usage;
