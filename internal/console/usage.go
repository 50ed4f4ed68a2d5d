package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
)

// The Usage page (issue 29): the auditor's reconciliation of Stripe's meter
// totals with the meter ledger, per meter, Stripe customer and window: what
// each side counted, the finding it made, and the correction it recorded
// (and whether it was sent) or the one it leaves to a person. Read-only: the
// auditor makes corrections (`pelguard-auditor usage --usage-auto-correct`).

// maxUsageRows bounds the page's findings.
const maxUsageRows = 200

// usageRow is a usage finding with its correction, if any.
type usageRow struct {
	ID               int64
	EventName        string
	StripeCustomerID string
	WindowStart      time.Time
	WindowEnd        time.Time
	Kind             string
	State            string
	Measure          string
	LedgerValue      string
	StripeValue      string
	Difference       string
	Checks           int
	ManualAction     string
	Resolution       string
	UpdatedAt        time.Time
	CorrectionKind   *string
	CorrectionUnits  *string
	CorrectionStatus *string
	CorrectionSentAt *time.Time
	CorrectionError  *string
}

const qUsage = `SELECT f.id, f.event_name, f.stripe_customer_id, f.window_start, f.window_end, f.kind, f.state, f.measure,
	f.ledger_value::text, f.stripe_value::text, (f.stripe_value - f.ledger_value)::text, f.checks,
	coalesce(f.manual_action, ''), coalesce(f.resolution, ''), f.updated_at,
	c.kind, c.units::text, c.status, c.sent_at, c.last_error
FROM {schema}.usage_findings f LEFT JOIN {schema}.usage_corrections c ON c.finding_id = f.id
WHERE ($1 = '' OR f.stripe_customer_id = $1) AND ($2 = '' OR f.event_name = $2)
	AND ($3 OR f.state IN ('suspect', 'open'))
ORDER BY f.window_start DESC, f.id DESC LIMIT $4`

func listUsage(ctx context.Context, db pg.DB, customer, meter string, all bool, n int) ([]usageRow, error) {
	rows, err := db.Query(ctx, qUsage, customer, meter, all, n)
	if err != nil {
		return nil, fmt.Errorf("listing usage findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[usageRow])
	if err != nil {
		return nil, fmt.Errorf("listing usage findings: %w", err)
	}
	return out, nil
}

func (s *Server) usagePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	customer, meter := strings.TrimSpace(q.Get("customer")), strings.TrimSpace(q.Get("meter"))
	all := q.Get("state") == "all"
	data := map[string]any{"Customer": customer, "Meter": meter, "All": all, "Now": s.now()}
	rows, err := listUsage(r.Context(), s.db, customer, meter, all, maxUsageRows+1)
	if missingTable(err) {
		data["Missing"] = true
		s.render(w, r, http.StatusOK, "usage", data)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(rows) > maxUsageRows {
		rows, data["Cut"] = rows[:maxUsageRows], maxUsageRows
	}
	for i := range rows {
		rows[i].ManualAction = redact.String(rows[i].ManualAction)
		if e := rows[i].CorrectionError; e != nil {
			v := redact.String(*e)
			rows[i].CorrectionError = &v
		}
	}
	data["Rows"] = rows
	if err := s.usageCompared(r.Context(), data, customer, meter); err != nil {
		s.fail(w, r, err)
		return
	}
	caps, err := s.meterCaps(r.Context(), customer, meter)
	if err != nil && !missingTable(err) {
		s.fail(w, r, err)
		return
	}
	data["Caps"], data["Month"] = caps, meterledger.MonthOf(time.Now())
	if customer != "" {
		use, err := s.meters.CustomerUsage(r.Context(), customer, time.Now())
		if err != nil && !missingTable(err) {
			s.fail(w, r, err)
			return
		}
		data["Use"] = use
	}
	s.render(w, r, http.StatusOK, "usage", data)
}

// meterCaps is the caps of this month (of meter, and of customer or of
// every customer, when given) with what each bounds.
func (s *Server) meterCaps(ctx context.Context, customer, meter string) ([]meterledger.CapUse, error) {
	caps, err := s.meters.CapsInUse(ctx, meter, time.Now())
	if err != nil || customer == "" {
		return caps, err
	}
	var out []meterledger.CapUse
	for _, c := range caps {
		if c.StripeCustomerID == customer || c.StripeCustomerID == meterledger.AnyCustomer {
			out = append(out, c)
		}
	}
	return out, nil
}

// usageCompared adds what was compared to the Usage page: the last runs,
// what the last finished one covered and, for a customer, each meter's
// last comparison and the events not compared yet.
func (s *Server) usageCompared(ctx context.Context, data map[string]any, customer, meter string) error {
	runs, err := usageRuns(ctx, s.db, 5)
	if err != nil {
		return err
	}
	data["Runs"] = runs
	for _, run := range runs {
		if run.Finished != nil && run.Error == "" {
			tot, err := comparedTotals(ctx, s.db, run.ID)
			if err != nil && !missingTable(err) {
				return err
			}
			data["LastOK"], data["Totals"] = run, tot
			break
		}
	}
	if customer == "" {
		stale, never, all, err := staleOf(ctx, s.db, meterledger.MonthOf(s.now()), meter, 20)
		if err != nil && !missingTable(err) {
			return err
		}
		data["Stale"], data["Never"], data["MonthPairs"] = stale, never, all
		return nil
	}
	cmp, err := comparedOf(ctx, s.db, customer, meter)
	if err != nil && !missingTable(err) {
		return err
	}
	data["Compared"] = cmp
	return nil
}
