-- The console pauses and resumes a stream's billing (the same change as
-- `pelguard-consumer pause` / `resume`, recorded in stream_fact_changes):
-- console_actions records them as actions 'pause' and 'resume', with who,
-- when, which stream and group, and why, like the console's other actions.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE console_actions DROP CONSTRAINT console_actions_action_check;
ALTER TABLE console_actions ADD CONSTRAINT console_actions_action_check
    CHECK (action IN ('refund', 'dismiss', 'resolve', 'replay', 'replay_reason', 'pause', 'resume'));

-- +goose Down
-- NOT VALID: the pause and resume rows already recorded stay (an audit
-- record is never deleted); new ones are refused.
ALTER TABLE console_actions DROP CONSTRAINT console_actions_action_check;
ALTER TABLE console_actions ADD CONSTRAINT console_actions_action_check
    CHECK (action IN ('refund', 'dismiss', 'resolve', 'replay', 'replay_reason')) NOT VALID;
