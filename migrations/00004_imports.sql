-- `consumer import` brings what a team billed before pelguard into the
-- ledger. Each run is recorded; a period with imported history makes the
-- consumer ask Stripe before the first charge of a key in it (invariant 9:
-- pelguard cannot prove from its own ledger that such a key was never
-- charged). Unqualified names: migrations run with search_path set to
-- pelguard's schema alone.

-- +goose Up
CREATE TABLE import_runs (
    id          bigserial   PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    sources     text        NOT NULL,
    period      text,
    imported    integer     NOT NULL DEFAULT 0,
    skipped     integer     NOT NULL DEFAULT 0,
    conflicts   integer     NOT NULL DEFAULT 0,
    summary     jsonb
);

CREATE TABLE imported_periods (
    billing_period   text        PRIMARY KEY,
    first_import_at  timestamptz NOT NULL DEFAULT now(),
    last_import_id   bigint      REFERENCES import_runs (id)
);

-- Findings an import records: two charges for one key become one ledger
-- row and a duplicate_charge finding.
ALTER TABLE audit_findings ADD COLUMN import_run_id bigint REFERENCES import_runs (id);

-- +goose Down
ALTER TABLE audit_findings DROP COLUMN import_run_id;
DROP TABLE imported_periods;
DROP TABLE import_runs;
