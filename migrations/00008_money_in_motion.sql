-- Money in motion (issue 21): bank debits that settle days later, charges
-- awaiting the customer, and declines retried under a new attempt's key.
--
-- New states:
--   processing       a PaymentIntent ended the create call "processing" with a
--                    pending charge (charge_id holds it): not charged, not
--                    chargeable again, not missing; polled (next_poll_at) and
--                    settled by webhooks until Stripe says it is final.
--   action_required  Stripe needs the customer (authentication, a payment
--                    method): a replay (or `consumer retry`) charges again
--                    under the next attempt's key once it is fixed.
--
-- attempt is the attempt whose idempotency key the next Stripe call uses:
-- attempt 1's key is the content hash (idempotency_key, unchanged), attempt
-- n >= 2's is the hash of the same business fields, the namespace and n. It
-- is advanced only in the fenced write that records Stripe's final failure
-- of attempt n-1, never by a takeover (that is `attempts`).
-- attempt_started_at and attempt_epoch measure the safe key window per
-- attempt. next_attempt_at: a retry the ledger drives (the stream entry was
-- acked). payment_intent_id: the latest attempt's intent, cancelled before
-- the next attempt if still open. failure_code: Stripe's decline or failure
-- code of the latest attempt.
--
-- webhook_events: Stripe event ids already applied, so a replayed event
-- changes nothing. Unqualified names: migrations run with search_path set to
-- pelguard's schema alone.

-- +goose Up
ALTER TABLE billing_records
    ADD COLUMN attempt            integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    ADD COLUMN attempt_started_at timestamptz,
    ADD COLUMN attempt_epoch      bigint      NOT NULL DEFAULT 1,
    ADD COLUMN next_attempt_at    timestamptz,
    ADD COLUMN next_poll_at       timestamptz,
    ADD COLUMN payment_intent_id  text,
    ADD COLUMN failure_code       text;

ALTER TABLE billing_records DROP CONSTRAINT billing_records_status_check;
ALTER TABLE billing_records ADD CONSTRAINT billing_records_status_check
    CHECK (status IN ('pending', 'charged', 'declined', 'failed', 'processing', 'action_required'));
ALTER TABLE billing_records DROP CONSTRAINT charge_id_iff_charged;
ALTER TABLE billing_records ADD CONSTRAINT charge_id_iff_charged
    CHECK ((status IN ('charged', 'processing')) = (charge_id IS NOT NULL));
ALTER TABLE billing_records ADD CONSTRAINT poll_only_when_processing
    CHECK (next_poll_at IS NULL OR status = 'processing');
ALTER TABLE billing_records ADD CONSTRAINT retry_only_when_unbilled
    CHECK (next_attempt_at IS NULL OR status IN ('declined', 'failed', 'action_required'));

CREATE INDEX billing_records_retry_due_idx ON billing_records (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX billing_records_poll_due_idx ON billing_records (next_poll_at) WHERE status = 'processing';
CREATE INDEX billing_records_intent_idx ON billing_records (payment_intent_id) WHERE payment_intent_id IS NOT NULL;

CREATE TABLE webhook_events (
    event_id    text        PRIMARY KEY,
    type        text        NOT NULL,
    object_id   text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    result      text        NOT NULL
);

-- +goose Down
DROP TABLE webhook_events;
DROP INDEX billing_records_intent_idx;
DROP INDEX billing_records_poll_due_idx;
DROP INDEX billing_records_retry_due_idx;
ALTER TABLE billing_records DROP CONSTRAINT retry_only_when_unbilled;
ALTER TABLE billing_records DROP CONSTRAINT poll_only_when_processing;
ALTER TABLE billing_records DROP CONSTRAINT charge_id_iff_charged;
ALTER TABLE billing_records ADD CONSTRAINT charge_id_iff_charged CHECK ((status = 'charged') = (charge_id IS NOT NULL));
ALTER TABLE billing_records DROP CONSTRAINT billing_records_status_check;
ALTER TABLE billing_records ADD CONSTRAINT billing_records_status_check
    CHECK (status IN ('pending', 'charged', 'declined', 'failed'));
ALTER TABLE billing_records
    DROP COLUMN failure_code,
    DROP COLUMN payment_intent_id,
    DROP COLUMN next_poll_at,
    DROP COLUMN next_attempt_at,
    DROP COLUMN attempt_epoch,
    DROP COLUMN attempt_started_at,
    DROP COLUMN attempt;
