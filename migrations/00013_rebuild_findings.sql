-- The ledger's repair from Stripe after it lost commits (issue 26): a key
-- whose only charges at Stripe are fully refunded is not recorded as
-- charged by the repair (its money is back with the customer, whoever
-- refunded it), nor left to be charged again without a word: it becomes a
-- refunded_only finding (subject: the key's idempotency key) for a person to
-- decide. refund_ledger rows the repair rebuilt from Stripe's refunds carry
-- source 'rebuilt'. Unqualified names: migrations run with search_path set
-- to pelguard's schema alone.

-- +goose Up
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN (
    'duplicate_charge', 'orphan_charge', 'missing_charge', 'amount_mismatch', 'stuck_pending',
    'disputed', 'ambiguous_legacy', 'refunded_only'));

-- +goose Down
DELETE FROM audit_findings WHERE kind = 'refunded_only';
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN (
    'duplicate_charge', 'orphan_charge', 'missing_charge', 'amount_mismatch', 'stuck_pending',
    'disputed', 'ambiguous_legacy'));
