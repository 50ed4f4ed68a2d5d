-- What pelguard does not know about its own meter events (the usage
-- reconciliation's interval, the settle command, replay overrides).
--
-- meter_events.outcome_unknown: some attempt of the event ended without
-- saying whether Stripe counted it (a timeout, a lost reply, a crash). Such
-- an event is never recorded failed afterwards: a later refusal (a revoked
-- key, a 400) parks it, its units stay counted, and the reconciliation
-- treats it as possibly counted. Rows written before this column existed
-- carry it when they were attempted more than once.
--
-- settled_at, settled_by, settle_reason: a person checked a parked event
-- at Stripe and said whether it counted (`pelguard-consumer meter-settle`);
-- the event is then delivered or failed for good, and known again.
--
-- replay_override: the operator's word (who, when, why) that reopened an
-- event that may have counted, past the safe window of its first attempt.
--
-- usage_stage and usage_findings keep, beside the delivered total, the
-- interval the events of unknown outcome (and unconfirmed corrections)
-- allow: Stripe's total differs only outside it.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE meter_events ADD COLUMN outcome_unknown boolean NOT NULL DEFAULT false,
    ADD COLUMN settled_at timestamptz, ADD COLUMN settled_by text, ADD COLUMN settle_reason text,
    ADD COLUMN replay_override text;
UPDATE meter_events SET outcome_unknown = true WHERE attempts > 1 AND status <> 'delivered';
COMMENT ON COLUMN meter_events.outcome_unknown IS 'An attempt ended without knowing whether Stripe counted the event: never recorded failed; possibly counted until settled.';

ALTER TABLE usage_stage ADD COLUMN unknown_low numeric NOT NULL DEFAULT 0,
    ADD COLUMN unknown_high numeric NOT NULL DEFAULT 0, ADD COLUMN unknown_events bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_delivery timestamptz;

ALTER TABLE usage_findings ADD COLUMN unknown_low numeric NOT NULL DEFAULT 0,
    ADD COLUMN unknown_high numeric NOT NULL DEFAULT 0, ADD COLUMN unknown_note text;
-- The usage reconciliation reads the corrections of each window it compares.
CREATE INDEX usage_corrections_window_idx ON usage_corrections (event_name, stripe_customer_id, window_start);

-- +goose Down
DROP INDEX usage_corrections_window_idx;
ALTER TABLE usage_findings DROP COLUMN unknown_note, DROP COLUMN unknown_high, DROP COLUMN unknown_low;
ALTER TABLE usage_stage DROP COLUMN last_delivery, DROP COLUMN unknown_events, DROP COLUMN unknown_high, DROP COLUMN unknown_low;
ALTER TABLE meter_events DROP COLUMN replay_override, DROP COLUMN settle_reason, DROP COLUMN settled_by,
    DROP COLUMN settled_at, DROP COLUMN outcome_unknown;
