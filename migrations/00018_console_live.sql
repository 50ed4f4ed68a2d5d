-- The console's live overview (issue 30): its charts count the ledger's
-- outcomes and the findings opened and closed per hour over the last day,
-- and it shows when Stripe's last webhook arrived. Each needs an index on a
-- time column, or the overview reads 1,000,000 ledger rows every refresh.
--
-- Charged rows are counted from billing_records_charged_at_idx (00001).
-- The other final outcomes are a small share of the rows and are written
-- once, so the partial index costs the billing path nothing on charged
-- rows. Findings and webhook events are written rarely.

-- +goose Up
CREATE INDEX billing_records_failed_at_idx ON billing_records (updated_at) INCLUDE (status)
    WHERE status IN ('declined', 'failed', 'action_required');
CREATE INDEX audit_findings_created_at_idx ON audit_findings (created_at);
CREATE INDEX audit_findings_closed_at_idx ON audit_findings (updated_at) WHERE state <> 'open';
CREATE INDEX webhook_events_received_at_idx ON webhook_events (received_at);

-- +goose Down
DROP INDEX webhook_events_received_at_idx;
DROP INDEX audit_findings_closed_at_idx;
DROP INDEX audit_findings_created_at_idx;
DROP INDEX billing_records_failed_at_idx;
