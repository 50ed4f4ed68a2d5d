-- Usage reconciliation (issue 29): the auditor compares Stripe's meter
-- event summaries with what meter_events delivered, per meter, Stripe
-- customer and window (an hour for recent windows, a UTC day for older
-- ones), and corrects what it safely can. Package audit (usage*.go) owns
-- these tables; internal/meterledger fills usage_stage, since it alone
-- reads meter_events.
--
-- usage_runs: one row per reconciliation run (what it compared, how it
-- ended); its id keys the stage.
--
-- usage_stage: the ledger's delivered totals per (meter, customer, window)
-- of one run, aggregated in SQL in one statement and read back a page of
-- customers at a time, so the auditor never holds the ledger in memory.
-- UNLOGGED: a crash loses only a run's scratch, which the next run
-- rebuilds. No key and no index: the one INSERT … SELECT writes it twice as
-- fast without them (an index on five columns cost more than the
-- aggregation), and reading a page of customers back is a scan of a table
-- of one row per window, not per event.
--
-- usage_findings: one row per (meter, customer, window) that differed.
-- 'suspect' until the same difference was seen in enough consecutive runs
-- (summaries are eventually consistent), then 'open' (usage_over: Stripe
-- counts more; usage_under: less); 'resolved' by a run once the totals
-- agree (resolution says why), 'dismissed' by a person. manual_action
-- names the correction a person must make when pelguard may not.
--
-- usage_corrections: one row per correction, recorded BEFORE its Stripe
-- call (status 'recorded'), so a crash between the record and the call
-- never makes it twice: a later run finishes it under the same identifier
-- and idempotency key while Stripe still guards them, and hands it to a
-- person after. At most one correction per finding (the primary key).
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE usage_runs (
    id               bigserial   PRIMARY KEY,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    hourly_from      timestamptz NOT NULL,
    daily_from       timestamptz NOT NULL,
    compared_to      timestamptz NOT NULL,
    windows_compared bigint      NOT NULL DEFAULT 0,
    requests         bigint      NOT NULL DEFAULT 0,
    error            text
);

CREATE UNLOGGED TABLE usage_stage (
    run_id             bigint      NOT NULL,
    event_name         text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    window_start       timestamptz NOT NULL,
    window_end         timestamptz NOT NULL,
    value              numeric     NOT NULL,
    events             bigint      NOT NULL
);

CREATE TABLE usage_findings (
    id                 bigserial   PRIMARY KEY,
    event_name         text        NOT NULL,
    meter_id           text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    window_start       timestamptz NOT NULL,
    window_end         timestamptz NOT NULL CHECK (window_end > window_start),
    kind               text        NOT NULL CHECK (kind IN ('usage_over', 'usage_under')),
    state              text        NOT NULL DEFAULT 'suspect'
                       CHECK (state IN ('suspect', 'open', 'resolved', 'dismissed')),
    -- What was compared: the meter's units (sum) or events (count).
    measure            text        NOT NULL CHECK (measure IN ('sum', 'count')),
    ledger_value       numeric     NOT NULL,
    stripe_value       numeric     NOT NULL,
    -- Consecutive runs that saw this very difference.
    checks             integer     NOT NULL DEFAULT 1 CHECK (checks >= 1),
    first_seen_run_id  bigint      NOT NULL REFERENCES usage_runs (id),
    last_seen_run_id   bigint      NOT NULL REFERENCES usage_runs (id),
    opened_at          timestamptz,
    resolved_at        timestamptz,
    resolution         text,
    manual_action      text,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    UNIQUE (event_name, stripe_customer_id, window_start, window_end),
    CONSTRAINT resolution_when_resolved CHECK ((state IN ('resolved', 'dismissed')) = (resolved_at IS NOT NULL)),
    CONSTRAINT opened_unless_suspect CHECK (state = 'suspect' OR opened_at IS NOT NULL OR state IN ('resolved', 'dismissed'))
);
CREATE INDEX usage_findings_live_idx ON usage_findings (event_name, stripe_customer_id, window_start)
    WHERE state IN ('suspect', 'open');

CREATE TABLE usage_corrections (
    finding_id         bigint      PRIMARY KEY REFERENCES usage_findings (id),
    -- negative_event: an event of the opposite sign under identifier (an
    -- over-count); resend: the window's delivered events sent again under
    -- their own identifiers (an under-count).
    kind               text        NOT NULL CHECK (kind IN ('negative_event', 'resend')),
    identifier         text        NOT NULL UNIQUE,
    event_name         text        NOT NULL,
    stripe_customer_id text        NOT NULL,
    window_start       timestamptz NOT NULL,
    window_end         timestamptz NOT NULL,
    -- negative_event: the value sent; resend: the units the finding lacked.
    units              numeric     NOT NULL,
    event_ts           timestamptz NOT NULL,
    status             text        NOT NULL DEFAULT 'recorded'
                       CHECK (status IN ('recorded', 'sent', 'failed', 'unknown')),
    -- Stripe guards the identifier (and the idempotency key) until then:
    -- a 'recorded' correction is sent again only before it.
    resend_until       timestamptz NOT NULL,
    source             text        NOT NULL,
    recorded_at        timestamptz NOT NULL,
    sent_at            timestamptz,
    events_sent        integer     NOT NULL DEFAULT 0,
    last_error         text
);
CREATE INDEX usage_corrections_time_idx ON usage_corrections (recorded_at);
CREATE INDEX usage_corrections_recorded_idx ON usage_corrections (recorded_at) WHERE status = 'recorded';

-- +goose Down
DROP TABLE usage_corrections;
DROP TABLE usage_findings;
DROP TABLE usage_stage;
DROP TABLE usage_runs;
