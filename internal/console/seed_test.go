package console

import (
	"context"
	"testing"
	"time"
)

// seedBig fills the ledger with rows rows (rows/12 customers, each charged
// in the 12 periods of 2025, mostly charged; a period's rows are written
// together, as consumers write them during their month; the last period's
// over the day before now) and audit_findings with findings findings of
// every kind and state, with generate_series (1,000,000 rows in one
// statement rather than a million round trips), then VACUUM ANALYZEs both
// so the planner sees their real size.
func (b *bundle) seedBig(t testing.TB, rows, findings int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	for i, q := range []string{
		`INSERT INTO {schema}.billing_records (customer_id, billing_period, stripe_customer_id, amount_cents, currency,
			idempotency_key, status, charge_id, first_attempt_at, charged_at, stream_message_id, updated_at)
		SELECT 'b' || (g % ($1 / 12 + 1)), '2025-' || lpad((1 + g / ($1 / 12 + 1))::text, 2, '0'), 'cus_b' || (g % ($1 / 12 + 1)), 1000 + g % 5000, 'usd',
			md5(g::text), s.status, CASE WHEN s.status = 'charged' THEN 'ch_b' || g END, $2::timestamptz,
			CASE WHEN s.status = 'charged' THEN t.at END, (1700000000000 + g) || '-0', t.at
		FROM generate_series(0, $1 - 1) g,
			-- The last period (2025-12) is the one billing now: written over the last day.
			LATERAL (SELECT CASE WHEN g / ($1 / 12 + 1) = 11 THEN $2::timestamptz + interval '48 hours' - (g % 86400) * interval '1 second'
				ELSE $2::timestamptz END AS at) t,
			LATERAL (SELECT CASE WHEN g % 50 = 0 THEN 'declined' WHEN g % 97 = 0 THEN 'pending' WHEN g % 89 = 0 THEN 'failed'
				ELSE 'charged' END AS status) s`,
		`INSERT INTO {schema}.audit_findings (kind, subject, state, customer_id, billing_period, stripe_customer_id,
			charge_id, canonical_charge_id, amount_cents, currency, detail, refund_id, created_at)
		SELECT k.kind, 'sub_' || g, st.state, 'b' || (g * 7 % ($1 / 12 + 1)), '2025-' || lpad((1 + g % 12)::text, 2, '0'),
			'cus_b' || (g * 7 % ($1 / 12 + 1)), 'ch_f' || g, 'ch_c' || g, 1000 + g % 5000, 'usd', 'seeded',
			CASE WHEN st.state = 'refunded' THEN 're_' || g END, $2::timestamptz - g * interval '1 second'
		FROM generate_series(1, $3) g,
			LATERAL (SELECT (ARRAY['duplicate_charge', 'orphan_charge', 'missing_charge', 'amount_mismatch', 'stuck_pending',
				'disputed', 'ambiguous_legacy'])[1 + g % 7] AS kind) k,
			LATERAL (SELECT (ARRAY['open', 'open', 'resolved', 'dismissed', 'refunded'])[1 + g % 5] AS state) st`,
	} {
		args := []any{rows, now.Add(-48 * time.Hour)}
		if i == 1 {
			args = append(args, findings)
		}
		if _, err := b.pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{`VACUUM ANALYZE {schema}.billing_records`, `VACUUM ANALYZE {schema}.audit_findings`} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}
