package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/redact"
)

// The meter-event browser (/meter-events) answers "was this event
// counted?": the meter ledger's events of a customer (or of every one),
// filtered by meter, status and identifier, newest first, a page at a
// time: status, attempts, last error (redacted), identifier, stream entry.
// Read-only. A customer's list reads meter_events_customer_idx (migration
// 00030); an identifier is looked for among a customer's events (an index
// by identifier alone cost every insert as much again).

// meterEventRow is one meter_events row as the browser shows it.
type meterEventRow struct {
	EventTS      time.Time
	Identifier   string
	EventName    string
	StripeCust   string
	CustomerID   string
	Value        int64
	Status       string
	Attempts     int
	FirstSentAt  time.Time
	DeliveredAt  *time.Time
	LastError    string
	StreamID     string
	Unknown      bool
	LeaseOwner   string
	LeaseExpires *time.Time
	CreatedAt    time.Time
	// Aggregate: the aggregate whose call carries the event (a sum meter's
	// events of one second, one Stripe call under the aggregate's own
	// identifier), with that call's status, value and members ("": none).
	Aggregate        string
	AggregateStatus  string
	AggregateValue   int64
	AggregateMembers int
}

// meterEventFilter is the browser's query.
type meterEventFilter struct {
	Customer, Meter, Status, Identifier string
	// Before is the page's cursor: the last row of the page before
	// (event_ts in Unix microseconds, identifier).
	BeforeTS *time.Time
	BeforeID string
}

// meterStatuses are the statuses a row may have: queued (recorded at
// ingest, not sent yet), sending, delivered, parked, failed.
var meterStatuses = []string{"queued", "sending", "delivered", "parked", "failed"}

// listMeterEvents lists a page of n events.
func listMeterEvents(ctx context.Context, db pg.DB, f meterEventFilter, n int) ([]meterEventRow, error) {
	q, args := meterEventsQuery(f, n)
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing meter events: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[meterEventRow])
	if err != nil {
		return nil, fmt.Errorf("listing meter events: %w", err)
	}
	for i := range out {
		out[i].LastError = redact.String(truncate(out[i].LastError, 500))
	}
	return out, nil
}

// meterEventsQuery builds the query from the filters given (an omitted one
// is not in it: the planner then uses the index that fits).
func meterEventsQuery(f meterEventFilter, n int) (string, []any) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if f.Customer != "" {
		add("m.stripe_customer_id = ?", f.Customer)
	}
	if f.Meter != "" {
		add("m.event_name = ?", f.Meter)
	}
	if f.Status != "" {
		add("m.status = ?", f.Status)
	}
	if f.Identifier != "" {
		add("m.identifier = ?", f.Identifier)
	}
	if f.BeforeTS != nil {
		args = append(args, *f.BeforeTS, f.BeforeID)
		where = append(where, fmt.Sprintf("(m.event_ts, m.identifier) < ($%d, $%d)", len(args)-1, len(args)))
	}
	// The page is read first (by the index that fits, in its order), then
	// its rows' aggregates: a join before the LIMIT would sort every row.
	q := `SELECT m.event_ts, m.identifier, m.event_name, m.stripe_customer_id, coalesce(m.customer_id, ''), m.value, m.status, m.attempts,
		m.first_sent_at, m.delivered_at, coalesce(m.last_error, ''), coalesce(m.stream_message_id, ''), m.outcome_unknown,
		coalesce(m.lease_owner, ''), m.lease_expires_at, m.created_at,
		coalesce(m.aggregate, ''), coalesce(a.status, ''), coalesce(a.value, 0), coalesce(a.members, 0)
	FROM (SELECT * FROM {schema}.meter_events m`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, n)
	q += fmt.Sprintf(` ORDER BY m.event_ts DESC, m.identifier DESC LIMIT $%d) m
	LEFT JOIN {schema}.meter_aggregates a ON a.identifier = m.aggregate
	ORDER BY m.event_ts DESC, m.identifier DESC`, len(args))
	return q, args
}

// cursor is a page's "older" link value: event_ts as Unix microseconds,
// a dot, the identifier.
func cursor(r meterEventRow) string {
	return strconv.FormatInt(r.EventTS.UnixMicro(), 10) + "." + r.Identifier
}

func parseCursor(s string) (*time.Time, string, bool) {
	us, id, ok := strings.Cut(s, ".")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || id == "" || len(id) > 100 {
		return nil, "", false
	}
	t := time.UnixMicro(n).UTC()
	return &t, id, true
}

func (s *Server) meterEventsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := meterEventFilter{Customer: strings.TrimSpace(q.Get("customer")), Meter: strings.TrimSpace(q.Get("meter")),
		Status: q.Get("status"), Identifier: strings.TrimSpace(q.Get("identifier"))}
	if f.Status != "" && !contains(meterStatuses, f.Status) {
		http.Error(w, fmt.Sprintf("bad request: status %q is not one of %s", truncate(f.Status, 40), strings.Join(meterStatuses, ", ")), http.StatusBadRequest)
		return
	}
	if b := q.Get("before"); b != "" {
		var ok bool
		if f.BeforeTS, f.BeforeID, ok = parseCursor(b); !ok {
			http.Error(w, "bad request: before is not a page cursor of this browser", http.StatusBadRequest)
			return
		}
	}
	data := map[string]any{"Customer": f.Customer, "Meter": f.Meter, "Status": f.Status, "Identifier": f.Identifier,
		"Statuses": meterStatuses, "First": f.BeforeTS == nil}
	if f.Identifier != "" && f.Customer == "" {
		data["Error"] = "Give the event's Stripe customer with its identifier: an identifier is looked for among a customer's events."
		s.render(w, r, http.StatusUnprocessableEntity, "meterevents", data)
		return
	}
	rows, err := listMeterEvents(r.Context(), s.db, f, s.cfg.PageSize+1)
	if missingTable(err) {
		data["Missing"] = true
		s.render(w, r, http.StatusOK, "meterevents", data)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(rows) > s.cfg.PageSize {
		rows = rows[:s.cfg.PageSize]
		v := url.Values{"customer": {f.Customer}, "meter": {f.Meter}, "status": {f.Status}, "identifier": {f.Identifier},
			"before": {cursor(rows[len(rows)-1])}}
		data["Next"] = "/meter-events?" + v.Encode()
	}
	data["Rows"] = rows
	if f.Customer != "" {
		bl, err := customerBacklog(r.Context(), s.db, f.Customer, f.Meter)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		data["Backlog"], data["Now"] = bl, s.now()
	}
	s.render(w, r, http.StatusOK, "meterevents", data)
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
