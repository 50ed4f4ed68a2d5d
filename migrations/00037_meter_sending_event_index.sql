-- An index for finding events left sending on their own (per-event calls,
-- not members of an aggregate) whose holder is gone: the sender lists them
-- beside the queued ones (internal/meterledger sender.go). Without it that
-- part of every listing read every sending row of the day, the members of
-- every aggregate in flight among them: a scan of the day's partition, 50
-- ms a listing at 5,000 events/s. Only events sending on their own are in
-- it: an aggregate's members enter sending with their aggregate set.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE INDEX meter_events_sending_event_idx ON meter_events (stream, event_ts) WHERE status = 'sending' AND aggregate IS NULL;

-- +goose Down
DROP INDEX meter_events_sending_event_idx;
