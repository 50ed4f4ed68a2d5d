-- More than one correction per usage window over its life, never the same
-- identifier twice: a window that drifts again after its correction is
-- corrected again (up to --usage-max-window-corrections), each correction
-- numbered (seq) and named by (window, seq), recorded before its call.
-- attempts counts the calls made for a correction, so that a duplicate
-- refusal of its identifier is read as "an earlier call of it counted"
-- only when there was an earlier call. stripe_value and ledger_value are
-- the finding's values the correction was decided on: the window's next
-- correction waits until the compared values moved (the summary shows the
-- correction) as well as the settle delay.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE usage_corrections ADD COLUMN seq integer NOT NULL DEFAULT 1 CHECK (seq >= 1),
    ADD COLUMN attempts integer NOT NULL DEFAULT 0, ADD COLUMN stripe_value numeric, ADD COLUMN ledger_value numeric;
-- Corrections recorded before this migration may have been called.
UPDATE usage_corrections SET attempts = 1 WHERE status <> 'recorded';
ALTER TABLE usage_corrections DROP CONSTRAINT usage_corrections_pkey;
ALTER TABLE usage_corrections ADD PRIMARY KEY (finding_id, seq);

-- +goose Down
DELETE FROM usage_corrections WHERE seq > 1;
ALTER TABLE usage_corrections DROP CONSTRAINT usage_corrections_pkey;
ALTER TABLE usage_corrections ADD PRIMARY KEY (finding_id);
ALTER TABLE usage_corrections DROP COLUMN ledger_value, DROP COLUMN stripe_value, DROP COLUMN attempts, DROP COLUMN seq;
