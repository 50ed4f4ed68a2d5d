-- The console pauses and resumes a stream's billing (the same change as
-- `pelguard-consumer pause` / `resume`, recorded in stream_fact_changes):
-- console_actions records them as actions 'pause' and 'resume', with who,
-- when, which stream and group, and why, like the console's other actions.
--
-- meter_events.attempts may be 0: a meter consumer that reserved an event
-- and then found its stream paused gives it back unsent
-- (meterledger.Unsent), taking back the attempt it counted. A sending row
-- with 0 attempts was never sent: its safe window starts at its next
-- (first real) attempt, however long the pause.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE console_actions DROP CONSTRAINT console_actions_action_check;
ALTER TABLE console_actions ADD CONSTRAINT console_actions_action_check
    CHECK (action IN ('refund', 'dismiss', 'resolve', 'replay', 'replay_reason', 'pause', 'resume'));
ALTER TABLE meter_events DROP CONSTRAINT meter_events_attempts_check;
ALTER TABLE meter_events ADD CONSTRAINT meter_events_attempts_check CHECK (attempts >= 0);

-- +goose Down
UPDATE meter_events SET attempts = 1 WHERE attempts = 0;
ALTER TABLE meter_events DROP CONSTRAINT meter_events_attempts_check;
ALTER TABLE meter_events ADD CONSTRAINT meter_events_attempts_check CHECK (attempts >= 1);
-- NOT VALID: the pause and resume rows already recorded stay (an audit
-- record is never deleted); new ones are refused.
ALTER TABLE console_actions DROP CONSTRAINT console_actions_action_check;
ALTER TABLE console_actions ADD CONSTRAINT console_actions_action_check
    CHECK (action IN ('refund', 'dismiss', 'resolve', 'replay', 'replay_reason')) NOT VALID;
