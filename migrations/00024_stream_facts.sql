-- What every role of a stream must agree on, recorded once per stream and
-- consumer group (DESIGN.md invariant 14), and the record of each change.
-- Package internal/streamfacts is the only code that writes these tables.
--
-- stream_namespaces: the namespace in every idempotency key (charges) or
-- meter-event identifier (usage) of the stream's events. The first role to
-- use the stream records it, after checking it against the ledger's rows;
-- a role started with another namespace refuses to start. Only
-- `pelguard-consumer namespace set` changes it.
--
-- stream_pauses: streams an operator paused (`pelguard-consumer pause`,
-- the console): while a row is here no consumer or re-drive of the stream
-- calls Stripe. Resuming deletes the row.
--
-- stream_fact_changes: who changed which fact of a stream, when, from what
-- to what, and why; never updated or deleted.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE stream_namespaces (
    stream         text        NOT NULL CHECK (stream <> ''),
    consumer_group text        NOT NULL CHECK (consumer_group <> ''),
    kind           text        NOT NULL CHECK (kind IN ('charges', 'usage')),
    namespace      text        NOT NULL CHECK (namespace <> ''),
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    recorded_by    text        NOT NULL,
    PRIMARY KEY (stream, consumer_group)
);
COMMENT ON TABLE stream_namespaces IS 'Per stream and group: the namespace of its idempotency keys or meter-event identifiers, which every role must run with (internal/streamfacts).';

CREATE TABLE stream_pauses (
    stream         text        NOT NULL CHECK (stream <> ''),
    consumer_group text        NOT NULL CHECK (consumer_group <> ''),
    paused_at      timestamptz NOT NULL DEFAULT now(),
    paused_by      text        NOT NULL CHECK (paused_by <> ''),
    reason         text        NOT NULL CHECK (btrim(reason) <> ''),
    PRIMARY KEY (stream, consumer_group)
);
COMMENT ON TABLE stream_pauses IS 'Streams whose billing an operator paused: no consumer or re-drive of them calls Stripe until resumed (internal/streamfacts).';

CREATE TABLE stream_fact_changes (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    stream         text        NOT NULL,
    consumer_group text        NOT NULL,
    fact           text        NOT NULL CHECK (fact IN ('namespace', 'pause', 'resume')),
    old_value      text,
    new_value      text,
    actor          text        NOT NULL CHECK (actor <> ''),
    reason         text        NOT NULL CHECK (btrim(reason) <> '')
);
CREATE INDEX stream_fact_changes_stream_idx ON stream_fact_changes (stream, consumer_group, id);
COMMENT ON TABLE stream_fact_changes IS 'Every change of a stream''s recorded facts (namespace, pause): who, when, old and new value, why.';

-- +goose Down
DROP TABLE stream_fact_changes;
DROP TABLE stream_pauses;
DROP TABLE stream_namespaces;
