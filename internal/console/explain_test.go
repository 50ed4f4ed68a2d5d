package console

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// bigTables are the tables a page must never read whole.
var bigTables = map[string]bool{"billing_records": true, "audit_findings": true, "refund_ledger": true,
	"console_actions": true, "audit_runs": true, "webhook_events": true}

// Every query a page runs, EXPLAINed on a seeded ledger with sequential
// scans priced out (enable_seqscan off): a Seq Scan left in a plan means no
// index can serve the query, and at 1,000,000 rows the page would read them
// all.
func TestPageQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.seedBig(t, 24_000, 5_000)
	names := []string{"customer_id", "billing_period"}
	cases := []struct {
		name string
		sql  string
		args []any
	}{
		{"overview periods", qPeriods, []any{12}},
		{"overview outcomes", qOutcomes, []any{"2025-06"}},
		{"overview open findings", qOpenByKind, nil},
		{"overview last run", qLastRun, nil},
		{"overview caps", qCaps, []any{12}},
		{"overview parked", qParked, []any{20}},
		{"findings, newest", qFindingsAll, findingQuery{Limit: 51}.args()},
		{"findings, kind", qFindingsAll, findingQuery{findingFilter: findingFilter{Kind: "orphan_charge"}, Limit: 51}.args()},
		{"findings, open page 2", qFindingsByState, findingQuery{findingFilter: findingFilter{State: "open", Before: 2500}, Limit: 51}.args()},
		{"findings, open duplicates", qFindingsByState, findingQuery{findingFilter: findingFilter{State: "open", Kind: "duplicate_charge"}, Limit: 51}.args()},
		{"findings, period", qFindingsByPeriod, findingQuery{findingFilter: findingFilter{Period: "2025-03"}, Limit: 51}.args()},
		{"findings, customer", qFindingsByCustomer, findingQuery{findingFilter: findingFilter{Customer: "b17"}, Limit: 51}.args()},
		{"findings, customer and period", qFindingsByCustomer, findingQuery{findingFilter: findingFilter{Customer: "b17", Period: "2025-03"}, Limit: 51}.args()},
		{"finding", qFinding, []any{int64(42)}},
		{"ledger row", qLedgerRow, []any{"b17", "2025-03", names}},
		{"customer periods", qCustomerPeriods, []any{"b17", "", 51}},
		{"customer periods page 2", qCustomerPeriods, []any{"b17", "2025-06", 51}},
		{"actions", qActions, []any{int64(0), "", 51}},
		{"actions of a finding", qActions, []any{int64(0), "finding:42", 51}},
		{"chart: charged per hour", qChargedByHour, []any{now.Add(-24 * time.Hour), now}},
		{"chart: failures per hour", qFailedByHour, []any{now.Add(-24 * time.Hour), now, []string{"2025-12", "2025-11"}}},
		{"chart: findings opened per hour", qOpenedByHour, []any{now.Add(-24 * time.Hour), now}},
		{"chart: findings closed per hour", qClosedByHour, []any{now.Add(-24 * time.Hour), now}},
		{"live: audit runs", qAuditRuns, []any{5}},
		{"live: last webhook", qLastWebhook, nil},
		{"live: webhooks in the last hour", qWebhooksSince, []any{now.Add(-time.Hour)}},
		{"rolling cap", `SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM {schema}.refund_ledger WHERE refunded_at > $1`, []any{now.Add(-24 * time.Hour)}},
	}
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	explain := func(sql string, args ...any) ([]string, []byte) {
		t.Helper()
		var plan []byte
		if err := conn.QueryRow(ctx, b.pool.SQL(`EXPLAIN (FORMAT JSON) `+sql), args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var root []struct{ Plan node }
		if err := json.Unmarshal(plan, &root); err != nil {
			t.Fatal(err)
		}
		return root[0].Plan.seqScans(), plan
	}
	// The check itself: a query no index serves is caught.
	if seq, _ := explain(`SELECT customer_id FROM {schema}.billing_records WHERE last_error = $1`, "x"); len(seq) != 1 {
		t.Fatalf("a filter on an unindexed column was not reported as a sequential scan: %v", seq)
	}
	for _, tc := range cases {
		if seq, plan := explain(tc.sql, tc.args...); len(seq) > 0 {
			t.Errorf("%s: sequential scan of %s\n%s", tc.name, strings.Join(seq, ", "), plan)
		}
	}
}

type node struct {
	NodeType string `json:"Node Type"`
	Relation string `json:"Relation Name"`
	Plans    []node `json:"Plans"`
}

func (n node) seqScans() []string {
	var out []string
	if n.NodeType == "Seq Scan" && bigTables[n.Relation] {
		out = append(out, n.Relation)
	}
	for _, c := range n.Plans {
		out = append(out, c.seqScans()...)
	}
	return out
}
