-- The console's live overview (issue 30): its charts count the findings
-- opened and closed per hour over the last day, and it shows when Stripe's
-- last webhook arrived. Each needs an index on a time column, or the
-- overview reads every finding or webhook event on every refresh.
--
-- The ledger needs none: charged rows are counted from
-- billing_records_charged_at_idx (00001), the final failures through
-- billing_records_period_status_idx (00010). An index on
-- billing_records.updated_at would make every ledger update (each lease
-- renewal sets updated_at) a non-HOT update. created_at and received_at
-- never change; findings are updated by audit runs alone.

-- +goose Up
CREATE INDEX audit_findings_created_at_idx ON audit_findings (created_at);
CREATE INDEX audit_findings_closed_at_idx ON audit_findings (updated_at) WHERE state <> 'open';
CREATE INDEX webhook_events_received_at_idx ON webhook_events (received_at);

-- +goose Down
DROP INDEX webhook_events_received_at_idx;
DROP INDEX audit_findings_closed_at_idx;
DROP INDEX audit_findings_created_at_idx;
