-- What the console's Usage page needs to say only what was checked.
--
-- usage_compared: one row per (meter, Stripe customer) the usage
-- reconciliation compared, rewritten by every run that compares it: which
-- run, when, the span of windows it compared and the windows it held back
-- because their delivery had not settled. The page shows, per
-- customer-meter, when it was last compared and what is not compared yet,
-- instead of calling windows nobody compared "in agreement". One row per
-- customer-meter, not per event or window; a run deletes the rows no run
-- has rewritten for 40 days (customers gone, meters retired), past the
-- 35 days Stripe keeps events for.
--
-- meter_events_customer_idx: the console's meter-event browser lists a
-- customer's events newest first (filtered by meter, status, identifier);
-- without it each look read every daily partition's whole primary key. Its
-- columns never change after the insert. No index by identifier alone: it
-- cost as much again on every insert (BenchmarkReserveFinishBrowserIndexes),
-- so the browser finds an identifier within a customer's events.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE usage_compared (
    event_name         text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    run_id             bigint      NOT NULL,
    compared_at        timestamptz NOT NULL,
    compared_from      timestamptz NOT NULL,
    compared_to        timestamptz NOT NULL CHECK (compared_to > compared_from),
    windows            bigint      NOT NULL DEFAULT 0,
    held_windows       integer     NOT NULL DEFAULT 0,
    held_from          timestamptz,
    PRIMARY KEY (event_name, stripe_customer_id),
    CONSTRAINT held_from_when_held CHECK ((held_windows > 0) = (held_from IS NOT NULL))
);
COMMENT ON TABLE usage_compared IS 'Per meter and Stripe customer: the last usage run that compared it, its span, the windows it held back (audit, usage reconciliation).';
CREATE INDEX meter_events_customer_idx ON meter_events (stripe_customer_id, event_ts DESC);

-- +goose Down
DROP INDEX meter_events_customer_idx;
DROP TABLE usage_compared;
