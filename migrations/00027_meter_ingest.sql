-- Usage at volume: meter events are recorded at ingest and sent from the
-- ledger (internal/meterledger ingest.go, sender.go).
--
-- meter_events.status 'queued': the event is recorded (its use counted
-- against its cap) and its stream entry acked; it has not been sent. A
-- sender moves it to 'sending' under a new epoch with its customer's meter
-- slot, exactly as a per-event reservation did. A queued row is known not
-- to be at Stripe.
--
-- meter_events.stream, fields: the stream the event came from and its
-- entry's fields, so a refusal is dead-lettered (and replayed) from the
-- ledger's copy once the entry is acked.
--
-- meter_send_fence: one row once any consumer records at ingest. From then
-- on a per-event consumer (which inserts rows straight as 'sending') is
-- refused by a trigger, so two kinds of consumer never both send on one
-- ledger; rows already sending finish (updates are not refused).
--
-- Unqualified names: migrations run with search_path set to pelguard's
-- schema alone.

-- +goose Up
ALTER TABLE meter_events DROP CONSTRAINT meter_events_status_check;
ALTER TABLE meter_events ADD CONSTRAINT meter_events_status_check
    CHECK (status IN ('queued', 'sending', 'delivered', 'parked', 'failed'));
ALTER TABLE meter_events ADD COLUMN stream text, ADD COLUMN fields jsonb;
CREATE INDEX meter_events_queued_idx ON meter_events (stream, stripe_customer_id, event_name, event_ts) WHERE status = 'queued';
COMMENT ON COLUMN meter_events.fields IS 'The stream entry''s fields (ingest): a refusal is dead-lettered from this copy.';

CREATE TABLE meter_send_fence (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    since      timestamptz NOT NULL,
    by_name    text        NOT NULL
);
COMMENT ON TABLE meter_send_fence IS 'Present: meter events are sent from the ledger after ingest; per-event sends are refused.';

CREATE FUNCTION meter_send_fence_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE fenced boolean;
BEGIN
    IF NEW.status = 'sending' AND NOT NEW.outcome_unknown THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.meter_send_fence)', TG_TABLE_SCHEMA) INTO fenced;
        IF fenced THEN
            RAISE EXCEPTION 'meter events on this ledger are sent from ingest (meter_send_fence): a per-event consumer may not send; upgrade it'
                USING ERRCODE = 'P0001', HINT = 'meter_send_fence';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER meter_send_fence BEFORE INSERT ON meter_events FOR EACH ROW EXECUTE FUNCTION meter_send_fence_check();

-- +goose Down
DROP TRIGGER meter_send_fence ON meter_events;
DROP FUNCTION meter_send_fence_check();
DROP TABLE meter_send_fence;
DROP INDEX meter_events_queued_idx;
ALTER TABLE meter_events DROP COLUMN stream, DROP COLUMN fields;
DELETE FROM meter_events WHERE status = 'queued';
ALTER TABLE meter_events DROP CONSTRAINT meter_events_status_check;
ALTER TABLE meter_events ADD CONSTRAINT meter_events_status_check
    CHECK (status IN ('sending', 'delivered', 'parked', 'failed'));
