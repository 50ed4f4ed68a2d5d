package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/pg"
)

// The search box (issue 30): one query — a customer id, a Stripe customer
// cus_…, a charge ch_…, a payment intent pi_…, a billing period, a stream
// entry id, or a customer and a period — answered from the ledger, the
// findings and the streams (never from Stripe: Stripe is read on the page
// that shows a charge). One place found: the answer is that page (the
// customer's period, with its ledger row, charges, findings, dead letters
// and actions). Several: a short list. None: the page says so and keeps the
// query. Every lookup reads an index (TestSearchQueriesUseIndexes) or one
// stream entry by id; none scans a stream.

// maxHits bounds each lookup of a search and the list it shows.
const maxHits = 20

// searchHit is one place a search found.
type searchHit struct {
	URL   string
	What  string // "ledger row", "finding 12", "stream entry", …
	Label string // the customer and period, or the finding
	Note  string
}

var streamID = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// customerURL is a customer's period page (its latest period when period
// is empty).
func customerURL(customer, period string) string {
	v := url.Values{"customer": {customer}}
	if period != "" {
		v.Set("period", period)
	}
	return "/customer?" + v.Encode()
}

const qSearchStripeCustomer = `SELECT customer_id, max(billing_period) FROM {schema}.billing_records WHERE stripe_customer_id = $1
	GROUP BY customer_id ORDER BY customer_id LIMIT $2`

const qSearchCharge = `SELECT customer_id, billing_period, status FROM {schema}.billing_records WHERE charge_id = $1 LIMIT $2`

const qSearchIntent = `SELECT customer_id, billing_period, status FROM {schema}.billing_records WHERE payment_intent_id = $1 LIMIT $2`

const qSearchMessage = `SELECT customer_id, billing_period, status FROM {schema}.billing_records WHERE stream_message_id = $1 LIMIT $2`

const qSearchPeriod = `SELECT EXISTS (SELECT 1 FROM {schema}.billing_records WHERE billing_period = $1)`

const qSearchFindingsCharge = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE charge_id = $1
	UNION SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE canonical_charge_id = $1 ORDER BY 1 DESC LIMIT $2`

const qSearchFindingsStripeCustomer = `SELECT ` + findingCols + ` FROM {schema}.audit_findings WHERE stripe_customer_id = $1
	ORDER BY id DESC LIMIT $2`

// ledgerHits runs one of the ledger lookups that return rows of
// (customer, period, status).
func ledgerHits(ctx context.Context, db pg.DB, q, arg, what string) ([]searchHit, error) {
	rows, err := db.Query(ctx, q, arg, maxHits)
	if err != nil {
		return nil, fmt.Errorf("searching the ledger: %w", err)
	}
	var out []searchHit
	defer rows.Close()
	for rows.Next() {
		var c, p, st string
		if err := rows.Scan(&c, &p, &st); err != nil {
			return nil, fmt.Errorf("searching the ledger: %w", err)
		}
		out = append(out, searchHit{URL: customerURL(c, p), What: what, Label: c + " · " + p, Note: st})
	}
	return out, rows.Err()
}

func findingHits(fs []findingRow) []searchHit {
	out := make([]searchHit, 0, len(fs))
	for _, f := range fs {
		h := searchHit{URL: fmt.Sprintf("/findings/%d", f.ID), What: fmt.Sprintf("finding %d (%s, %s)", f.ID, f.Kind, f.State),
			Label: f.StripeCust, Note: f.ChargeID}
		if f.CustomerID != "" && f.BillingPeriod != "" {
			h.URL, h.Label = customerURL(f.CustomerID, f.BillingPeriod), f.CustomerID+" · "+f.BillingPeriod
		}
		out = append(out, h)
	}
	return out
}

func queryFindings(ctx context.Context, db pg.DB, q, arg string) ([]findingRow, error) {
	rows, err := db.Query(ctx, q, arg, maxHits)
	if err != nil {
		return nil, fmt.Errorf("searching the findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[findingRow])
	if err != nil {
		return nil, fmt.Errorf("searching the findings: %w", err)
	}
	return out, nil
}

// search answers one query with the places it names.
func (s *Server) search(ctx context.Context, q string) ([]searchHit, error) {
	var hits []searchHit
	add := func(h []searchHit, err error) error {
		hits = append(hits, h...)
		return err
	}
	// "customer period": both words, the period valid.
	if c, p, ok := strings.Cut(q, " "); ok {
		p = strings.TrimSpace(p)
		if event.ValidPeriod(p) == nil && c != "" && !strings.ContainsAny(c, " \t") {
			row, err := getLedgerRow(ctx, s.db, c, p)
			if err != nil {
				return nil, err
			}
			fs, err := listFindings(ctx, s.db, findingQuery{findingFilter: findingFilter{Customer: c, Period: p}, Limit: 1})
			if err != nil {
				return nil, err
			}
			if row != nil || len(fs) > 0 {
				return []searchHit{{URL: customerURL(c, p), What: "ledger row", Label: c + " · " + p}}, nil
			}
		}
		return nil, nil // no id of any kind holds a space
	}
	switch {
	case strings.HasPrefix(q, "cus_"):
		rows, err := s.db.Query(ctx, qSearchStripeCustomer, q, maxHits)
		if err != nil {
			return nil, fmt.Errorf("searching the ledger: %w", err)
		}
		type cp struct{ C, P string }
		cps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[cp])
		if err != nil {
			return nil, fmt.Errorf("searching the ledger: %w", err)
		}
		for _, x := range cps {
			hits = append(hits, searchHit{URL: customerURL(x.C, ""), What: "customer", Label: x.C, Note: "latest period " + x.P})
		}
		fs, err := queryFindings(ctx, s.db, qSearchFindingsStripeCustomer, q)
		if err != nil {
			return nil, err
		}
		// A customer the ledger knows leads to its page; the findings of
		// its periods are there. Findings of no ledger customer (an orphan
		// charge) are listed themselves.
		known := map[string]bool{}
		for _, x := range cps {
			known[x.C] = true
		}
		for i, h := range findingHits(fs) {
			if known[fs[i].CustomerID] {
				continue
			}
			hits = append(hits, h)
		}
		// A customer billed through meters: its use and caps.
		meters, latest, err := s.meters.CustomerMeters(ctx, q)
		if err != nil && !missingTable(err) {
			return nil, err
		}
		if meters > 0 {
			hits = append(hits, searchHit{URL: "/usage?customer=" + url.QueryEscape(q), What: "meter usage", Label: q,
				Note: fmt.Sprintf("%d meter(s), latest month %s", meters, latest.Format("2006-01"))})
		}
	case strings.HasPrefix(q, "ch_") || strings.HasPrefix(q, "py_"):
		if err := add(ledgerHits(ctx, s.db, qSearchCharge, q, "ledger row (its charge)")); err != nil {
			return nil, err
		}
		fs, err := queryFindings(ctx, s.db, qSearchFindingsCharge, q)
		if err != nil {
			return nil, err
		}
		hits = append(hits, findingHits(fs)...)
	case strings.HasPrefix(q, "pi_"):
		if err := add(ledgerHits(ctx, s.db, qSearchIntent, q, "ledger row (its payment intent)")); err != nil {
			return nil, err
		}
	}
	if streamID.MatchString(q) { // 2026-11 is a period and an entry id both
		if err := add(ledgerHits(ctx, s.db, qSearchMessage, q, "ledger row (its stream message)")); err != nil {
			return nil, err
		}
		hits = append(hits, s.entryHits(ctx, q)...)
	}
	if event.ValidPeriod(q) == nil {
		var ok bool
		if err := s.db.QueryRow(ctx, qSearchPeriod, q).Scan(&ok); err != nil {
			return nil, fmt.Errorf("searching the ledger: %w", err)
		}
		if ok {
			hits = append(hits, searchHit{URL: "/?period=" + url.QueryEscape(q), What: "billing period", Label: q,
				Note: "the ledger's rows of the period by outcome"})
		}
		fs, err := listFindings(ctx, s.db, findingQuery{findingFilter: findingFilter{Period: q}, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(fs) > 0 {
			hits = append(hits, searchHit{URL: "/findings?period=" + url.QueryEscape(q), What: "findings", Label: q,
				Note: "the findings of the period"})
		}
	}
	// Any query may be a customer id too (ids are the team's own text).
	ps, err := customerPeriods(ctx, s.db, q, "", 1)
	if err != nil {
		return nil, err
	}
	if len(ps) > 0 {
		hits = append(hits, searchHit{URL: customerURL(q, ""), What: "customer", Label: q, Note: "latest period " + ps[0].Period})
	} else {
		fs, err := listFindings(ctx, s.db, findingQuery{findingFilter: findingFilter{Customer: q}, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(fs) > 0 {
			hits = append(hits, searchHit{URL: customerURL(q, fs[0].BillingPeriod), What: "customer (findings only)", Label: q})
		}
	}
	return dedupe(hits), nil
}

// dedupe keeps the first hit of each page: a charge that is both the
// ledger's and a finding's lands once on the customer's period.
func dedupe(hits []searchHit) []searchHit {
	seen := map[string]bool{}
	out := hits[:0]
	for _, h := range hits {
		if !seen[h.URL] {
			seen[h.URL] = true
			out = append(out, h)
		}
	}
	if len(out) > maxHits {
		out = out[:maxHits]
	}
	return out
}

// entryHits finds a stream entry id in each stream and its dead letters,
// by id (XRANGE id id: one entry, no scan), and names the customer and
// period of its payload.
func (s *Server) entryHits(ctx context.Context, id string) []searchHit {
	var out []searchHit
	for _, st := range s.cfg.Streams {
		for _, name := range []string{st.Name, consumer.DeadLetterStream(st.Name)} {
			msgs, err := s.cfg.Redis.XRangeN(ctx, name, id, id, 1).Result()
			if err != nil || len(msgs) != 1 {
				continue
			}
			c, p := payloadKey(msgs[0])
			h := searchHit{What: "stream entry of " + name, Label: id, Note: "no customer in its payload"}
			if name != st.Name {
				h.What = "dead letter of " + st.Name
			}
			switch {
			case c != "":
				h.URL, h.Label, h.Note = customerURL(c, p), c+" · "+p, ""
			case name != st.Name:
				h.URL = "/dead?stream=" + url.QueryEscape(st.Name) + "&after=" + url.QueryEscape(prevID(id))
			default:
				continue // an entry of no customer: nothing to show it on
			}
			out = append(out, h)
		}
	}
	return out
}

// payloadKey is the customer and period of an entry's (or a dead
// letter's) event payload.
func payloadKey(m redis.XMessage) (string, string) {
	raw, _ := m.Values["payload"].(string)
	var ev struct {
		CustomerID    string `json:"customer_id"`
		BillingPeriod string `json:"billing_period"`
	}
	if json.Unmarshal([]byte(raw), &ev) != nil {
		return "", ""
	}
	return truncate(ev.CustomerID, 64), truncate(ev.BillingPeriod, 32)
}

// prevID is the stream id just before id, so that a page "after" it starts
// at id itself.
func prevID(id string) string {
	ms, seq, _ := strings.Cut(id, "-")
	if seq != "0" && seq != "" {
		var n uint64
		fmt.Sscan(seq, &n)
		return fmt.Sprintf("%s-%d", ms, n-1)
	}
	var n uint64
	fmt.Sscan(ms, &n)
	if n == 0 {
		return "0-0"
	}
	return fmt.Sprintf("%d-18446744073709551615", n-1)
}

// searchPage is GET /search?q=…: one hit is the answer (a redirect), more
// are listed, none is said.
func (s *Server) searchPage(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	data := map[string]any{"Q": q}
	if q == "" {
		s.render(w, r, http.StatusOK, "search", data)
		return
	}
	if len(q) > 200 {
		data["Error"] = "That is longer than any id: give a customer id, cus_…, ch_…, pi_…, a period or a stream entry id."
		s.render(w, r, http.StatusUnprocessableEntity, "search", data)
		return
	}
	hits, err := s.search(r.Context(), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(hits) == 1 {
		http.Redirect(w, r, hits[0].URL, http.StatusSeeOther)
		return
	}
	data["Hits"] = hits
	status := http.StatusOK
	if len(hits) == 0 {
		status = http.StatusNotFound
	}
	s.render(w, r, status, "search", data)
}
