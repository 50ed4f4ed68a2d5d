-- A usage window is compared once its last delivery and last correction
-- are older than the settle delay (Stripe's summaries lag what it received,
-- and a backlog delivers events hours after their timestamps). A window
-- whose invoice closes before that is compared anyway: early_note says so
-- and names it for a person; nothing is corrected automatically then.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE usage_findings ADD COLUMN early_note text;

-- +goose Down
ALTER TABLE usage_findings DROP COLUMN early_note;
