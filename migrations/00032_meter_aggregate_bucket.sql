-- Aggregates of a bucket wider than a second (the meter consumer's
-- --aggregate-bucket, internal/meterledger/bucket.go): an aggregate's
-- members are the queued events of one customer-meter whose timestamps
-- fall in one bucket [t, t + width) (t aligned to the width from the Unix
-- epoch) and whose arrival buckets b = max(entry second, event second),
-- aligned down to the width, are equal; it is sent with timestamp t.
--
-- meter_aggregates.bucket_seconds: the width it was formed with (1 for
-- aggregates formed before: per second). second is t; arrival_second the
-- aligned arrival bucket. A second aggregate of one (second,
-- arrival_second, bucket_seconds) is a late join; aggregates of another
-- width are not: a width changed between runs leaves the aggregates formed
-- before as they were and groups the events still queued by the new one.
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE meter_aggregates ADD COLUMN bucket_seconds integer NOT NULL DEFAULT 1
	CONSTRAINT meter_aggregates_bucket_divides_an_hour CHECK (bucket_seconds BETWEEN 1 AND 3600 AND 3600 % bucket_seconds = 0);
COMMENT ON COLUMN meter_aggregates.bucket_seconds IS 'Width of the event-time bucket the aggregate was formed with (seconds; divides an hour).';
COMMENT ON COLUMN meter_aggregates.second IS 'Start of the bucket of event time (aligned to bucket_seconds): the timestamp sent to Stripe.';
COMMENT ON COLUMN meter_aggregates.arrival_second IS 'Arrival bucket: max(entry second, event second) of every member, aligned down to bucket_seconds.';
COMMENT ON TABLE meter_aggregates IS 'One Stripe call carrying the sum of a customer-meter''s events of one bucket of event time (a second by default); members in meter_events.aggregate.';

-- +goose Down
COMMENT ON TABLE meter_aggregates IS 'One Stripe call carrying the sum of a customer-meter''s events of one second; members in meter_events.aggregate.';
COMMENT ON COLUMN meter_aggregates.arrival_second IS 'Arrival bucket: max(entry second, event second) of every member.';
COMMENT ON COLUMN meter_aggregates.second IS NULL;
ALTER TABLE meter_aggregates DROP COLUMN bucket_seconds;
