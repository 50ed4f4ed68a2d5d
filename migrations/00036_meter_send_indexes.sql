-- Indexes for sending from the ledger at volume (internal/meterledger
-- sender.go and aggregate.go):
--
-- meter_events_queued_ts_idx: the oldest queued events of a stream, read
-- in timestamp order a bounded number at a time, so listing what to send
-- next never sorts the whole backlog.
--
-- meter_events_aggregate_idx: an aggregate's members, read and written by
-- its identifier after each call.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
CREATE INDEX meter_events_queued_ts_idx ON meter_events (stream, event_ts) WHERE status = 'queued';
CREATE INDEX meter_events_aggregate_idx ON meter_events (aggregate) WHERE aggregate IS NOT NULL;

-- +goose Down
DROP INDEX meter_events_aggregate_idx;
DROP INDEX meter_events_queued_ts_idx;
