-- The auditor's memory: runs (checkpoints) and findings (unique per kind and
-- subject, so a rerun adds nothing and a resolved finding stays resolved).

-- +goose Up
CREATE TABLE audit_runs (
    id              bigserial   PRIMARY KEY,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    window_from     timestamptz NOT NULL,
    window_to       timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'ok', 'failed')),
    charges_scanned bigint      NOT NULL DEFAULT 0,
    findings_new    integer     NOT NULL DEFAULT 0,
    error           text,
    CONSTRAINT window_ordered CHECK (window_from < window_to)
);
CREATE INDEX audit_runs_ok_idx ON audit_runs (window_to DESC) WHERE status = 'ok';

CREATE TABLE audit_findings (
    id                  bigserial   PRIMARY KEY,
    kind                text        NOT NULL CHECK (kind IN (
                            'duplicate_charge', 'orphan_charge', 'missing_charge',
                            'amount_mismatch', 'stuck_pending')),
    -- subject is what the finding is about: a Stripe charge id for
    -- duplicate/orphan/mismatch findings, the idempotency key for
    -- missing/stuck ones.
    subject             text        NOT NULL,
    state               text        NOT NULL DEFAULT 'open'
                        CHECK (state IN ('open', 'refunded', 'resolved', 'dismissed')),
    legacy              boolean     NOT NULL DEFAULT false,
    customer_id         text,
    billing_period      text,
    stripe_customer_id  text,
    charge_id           text,
    canonical_charge_id text,
    idempotency_key     text,
    amount_cents        bigint,
    currency            text,
    detail              text        NOT NULL DEFAULT '',
    refund_id           text,
    first_run_id        bigint      REFERENCES audit_runs (id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, subject),
    -- Invariant 6: the canonical charge is never the one refunded.
    CONSTRAINT never_refund_canonical CHECK (charge_id IS NULL OR canonical_charge_id IS NULL OR charge_id <> canonical_charge_id),
    CONSTRAINT refund_id_iff_refunded CHECK ((state = 'refunded') = (refund_id IS NOT NULL))
);
CREATE INDEX audit_findings_open_idx ON audit_findings (kind) WHERE state = 'open';

-- +goose Down
DROP TABLE audit_findings;
DROP TABLE audit_runs;
