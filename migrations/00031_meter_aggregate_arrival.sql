-- Per-second aggregates formed from the stream (internal/meterledger
-- aggregate.go): an aggregate's members are all queued events of one
-- customer-meter with one timestamp second s and one arrival bucket
-- b = max(a, s), where a is the second the event's stream entry was added
-- (its entry id's milliseconds / 1000, from meter_events.stream_message_id).
-- The bucket is formed only once the consumer group's ingest watermark has
-- passed its end, so its members are fixed by the stream: the same entries
-- re-delivered after a rollback form the same aggregate.
--
-- meter_aggregates.arrival_second: b (NULL for aggregates formed before).
-- A second aggregate of one (s, b) is a late join (logged): an event whose
-- entry was acked before the first one formed, queued after it.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE meter_aggregates ADD COLUMN arrival_second bigint;
COMMENT ON COLUMN meter_aggregates.arrival_second IS 'Arrival bucket: max(entry second, event second) of every member.';
CREATE INDEX meter_aggregates_bucket_idx ON meter_aggregates (stream, stripe_customer_id, event_name, second, arrival_second);

-- +goose Down
DROP INDEX meter_aggregates_bucket_idx;
ALTER TABLE meter_aggregates DROP COLUMN arrival_second;
