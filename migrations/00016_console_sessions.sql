-- The console's sessions, login throttle and signing key in Postgres
-- (issue 30), so that a restart or a second replica of pelguard-console
-- keeps everyone logged in and every replica agrees on who is locked out.
--
-- console_sessions: one row per login. token_hash is the SHA-256 of the
-- cookie's random token (the token itself is never stored: a copy of the
-- table logs nobody in); csrf is the session's CSRF secret, which its forms
-- carry. Expired rows are deleted at each login (expires_at index).
--
-- console_login_attempts: one row per login attempt not known to have
-- succeeded, per scope ('user': the name typed; 'addr': the client address):
-- a row is written before the password is checked (so that parallel guesses
-- are counted too) and deleted when the login succeeds; the rest are the
-- failures a window counts. Rows older than the longest window are deleted
-- at each attempt (the at index).
--
-- console_keys: the key that signs the console's one-time action tokens
-- and proxy users' CSRF tokens, made once by the first replica that needs
-- it, so that a confirmation page one replica rendered is accepted by
-- another. Unqualified names: migrations run with search_path set to
-- pelguard's schema alone.
--
-- The indexes serve the console's search (a Stripe customer, a charge, a
-- stream entry id): each finds its rows without reading billing_records or
-- audit_findings whole. payment_intent_id has its index since 00008.

-- +goose Up
CREATE TABLE console_sessions (
    token_hash  bytea       PRIMARY KEY,
    username    text        NOT NULL CHECK (username <> ''),
    csrf        text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    remote_addr text
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);

CREATE TABLE console_login_attempts (
    id    bigserial   PRIMARY KEY,
    scope text        NOT NULL CHECK (scope IN ('user', 'addr')),
    key   text        NOT NULL,
    at    timestamptz NOT NULL
);
CREATE INDEX console_login_attempts_key_idx ON console_login_attempts (scope, key, at);
CREATE INDEX console_login_attempts_at_idx ON console_login_attempts (at);

CREATE TABLE console_keys (
    name       text        PRIMARY KEY,
    key        bytea       NOT NULL CHECK (length(key) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX billing_records_stripe_customer_idx ON billing_records (stripe_customer_id);
CREATE INDEX billing_records_charge_idx ON billing_records (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX billing_records_stream_message_idx ON billing_records (stream_message_id) WHERE stream_message_id IS NOT NULL;
CREATE INDEX audit_findings_charge_idx ON audit_findings (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX audit_findings_canonical_charge_idx ON audit_findings (canonical_charge_id) WHERE canonical_charge_id IS NOT NULL;
CREATE INDEX audit_findings_stripe_customer_idx ON audit_findings (stripe_customer_id) WHERE stripe_customer_id IS NOT NULL;

-- +goose Down
DROP INDEX audit_findings_stripe_customer_idx;
DROP INDEX audit_findings_canonical_charge_idx;
DROP INDEX audit_findings_charge_idx;
DROP INDEX billing_records_stream_message_idx;
DROP INDEX billing_records_charge_idx;
DROP INDEX billing_records_stripe_customer_idx;
DROP TABLE console_keys;
DROP TABLE console_login_attempts;
DROP TABLE console_sessions;
