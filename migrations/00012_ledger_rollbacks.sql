-- A ledger that went back in time (issue 26): a failover to an asynchronous
-- replica, or a restore from a backup, erases the last commits while Redis
-- and Stripe remember what they did. See DESIGN.md "The ledger's own
-- losses".
--
-- ledger_witness: one row per writer (a consumer, the reaper, the auditor,
-- the webhook receiver, the console). Its seq grows inside every ledger
-- transaction whose effect leaves Postgres (an XACK, a refund, a dead
-- letter), and the value is mirrored to Redis and kept in the writers'
-- memory after the commit and before that effect. A seq in Redis or memory
-- above the one here means commits were lost. Rows idle for a week are
-- pruned (Redis first).
-- ledger_fence: one row. ledger_id names this ledger (a replica and a
-- restore share it; a new database does not), so witnesses of another
-- ledger in the same Redis are never compared. epoch_floor: every epoch
-- issued from now on is above it; a rollback raises it past every epoch the
-- lost history could have handed out, so a holder from before the failover
-- never passes a fenced write.
-- ledger_rollbacks: each detected rollback, what it lost as far as the
-- witnesses tell, and its repair from Stripe. While one is unrepaired the
-- fleet asks Stripe before every charge.
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE TABLE ledger_witness (
    writer     text        PRIMARY KEY,
    seq        bigint      NOT NULL CHECK (seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ledger_fence (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    ledger_id   text        NOT NULL DEFAULT gen_random_uuid()::text,
    epoch_floor bigint      NOT NULL DEFAULT 0 CHECK (epoch_floor >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO ledger_fence DEFAULT VALUES;

CREATE TABLE ledger_rollbacks (
    id                bigserial   PRIMARY KEY,
    detected_at       timestamptz NOT NULL,
    detected_by       text        NOT NULL,
    -- Which witnesses went back, from what to what.
    evidence          text        NOT NULL,
    -- Where the repair starts reading Stripe: the last surviving witness
    -- commit, less a margin.
    lost_since        timestamptz NOT NULL,
    epoch_floor       bigint      NOT NULL,
    rows_fenced       bigint      NOT NULL DEFAULT 0,
    repair_started_at timestamptz,
    repaired_at       timestamptz,
    repaired_by       text,
    -- What the repair rebuilt: rows the failover lost, rows taken back to
    -- pending or processing, refunds, and what it could not decide.
    rows_rebuilt      integer     NOT NULL DEFAULT 0,
    rows_repaired     integer     NOT NULL DEFAULT 0,
    refunds_rebuilt   integer     NOT NULL DEFAULT 0,
    findings          integer     NOT NULL DEFAULT 0,
    report            text,
    last_error        text
);
CREATE INDEX ledger_rollbacks_open_idx ON ledger_rollbacks (id) WHERE repaired_at IS NULL;

-- +goose Down
DROP TABLE ledger_rollbacks;
DROP TABLE ledger_fence;
DROP TABLE ledger_witness;
