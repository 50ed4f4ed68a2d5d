package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/redisurl"
	"github.com/pelguard/pelguard/stripeapi"
)

var pageNames = []string{"login", "overview", "findings", "finding", "confirm", "dead", "customer", "actions", "action", "ledger", "search", "pel", "usage", "meterevents", "pause"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"money": money,
		"ago":   func(t time.Time) string { return ago(time.Since(t)) },
		"dur":   ago,
		"ts":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		// q escapes a query value once: html/template escapes a plain
		// string in a URL's query again (a stream "billing:events" became
		// billing%253Aevents); QueryEscape's output is safe as a URL part.
		"q":    func(v string) template.URL { return template.URL(url.QueryEscape(v)) },
		"id64": func(n int64) string { return strconv.FormatInt(n, 10) },
		"span": span,
	}
	out := map[string]*template.Template{}
	for _, p := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+p+".html", "templates/part_*.html")
		if err != nil {
			return nil, fmt.Errorf("parsing page %s: %w", p, err)
		}
		out[p] = t
	}
	return out, nil
}

// money renders minor units: 2500 usd → 25.00 USD.
func money(minor int64, currency string) string { return alerts.Money(minor, currency) }

func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%.1fh", d.Hours())
	}
	return fmt.Sprintf("%.1fd", d.Hours()/24)
}

// render writes page with data; every page gets who is looking and whether
// actions are allowed.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, page string, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	data["Me"] = who(r)
	data["Actions"] = s.cfg.AllowActions
	data["Proxy"] = s.cfg.ProxyUserHeader != ""
	data["Page"] = page
	if _, ok := data["Q"]; !ok {
		data["Q"] = "" // the header's search box
	}
	if data["Me"].(identity).User != "" {
		data["Rollback"] = s.banner(r.Context())
		data["Paused"] = s.pausedBanner(r.Context())
	}
	var b strings.Builder
	if err := s.pages[page].ExecuteTemplate(&b, "layout.html", data); err != nil {
		s.log.Error("rendering a console page", "page", page, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail answers a failed read; the error is logged and shown redacted.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("console page failed", "path", r.URL.Path, "error", err)
	http.Error(w, "error: "+redact.String(err.Error()), http.StatusInternalServerError)
}

func (s *Server) chargeURL(id string) string {
	if id == "" {
		return ""
	}
	return s.cfg.DashboardURL + "/payments/" + url.PathEscape(id)
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ps, err := periods(ctx, s.db, 12)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	period := r.URL.Query().Get("period")
	if period == "" && len(ps) > 0 {
		period = ps[0]
	}
	data := map[string]any{"Periods": ps, "Period": period}
	// The live pipeline reads Redis and its own tables beside the queries below.
	type liveResult struct {
		d   liveData
		err error
	}
	liveCh := make(chan liveResult, 1)
	if s.liveOff {
		liveCh <- liveResult{}
	} else {
		go func() {
			d, err := s.live(ctx, ps)
			liveCh <- liveResult{d, err}
		}()
	}
	if data["LastRollback"], data["RollbackMissing"], err = s.lastRollback(ctx); err != nil {
		s.fail(w, r, err)
		return
	}
	if data["Outcomes"], err = outcomes(ctx, s.db, period); err != nil {
		s.fail(w, r, err)
		return
	}
	if data["Caps"], err = caps(ctx, s.db, 12); err != nil {
		s.fail(w, r, err)
		return
	}
	if data["Parked"], err = parkedRows(ctx, s.db, 20); err != nil {
		s.fail(w, r, err)
		return
	}
	run, err := lastRun(ctx, s.db)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data["Run"] = run
	if run != nil && run.HaveOKRun {
		data["RunAge"] = ago(s.now().Sub(run.LastOK))
	}
	if data["Open"], err = openByKind(ctx, s.db); err != nil {
		s.fail(w, r, err)
		return
	}
	data["Streams"], data["Losses"] = s.streamStats(ctx), s.streamLosses(ctx)
	for _, st := range s.cfg.Streams {
		data["MeterStreams"] = data["MeterStreams"] == true || st.Meter
	}
	// Through Redis Sentinel, the primary the console's connections reach:
	// after a failover, the promoted one.
	data["RedisPrimary"], _ = redisurl.Primary(s.cfg.Redis)
	data["PassLog"], data["Refresh"], data["Prometheus"] = reaper.PassLogLength, s.refresh(r), s.cfg.PrometheusURL != ""
	if s.cfg.ConsumerIdle > 0 {
		data["ConsumerIdle"] = s.cfg.ConsumerIdle
	}
	lr := <-liveCh
	if lr.err != nil {
		s.fail(w, r, lr.err)
		return
	}
	if !s.liveOff {
		data["Live"] = lr.d
	}
	reasons, truncated, err := s.deadByReason(ctx)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data["Reasons"], data["ReasonsTruncated"], data["Scan"] = reasons, truncated, s.cfg.DeadLetterScan
	s.render(w, r, http.StatusOK, "overview", data)
}

func (s *Server) filterOf(r *http.Request) findingFilter {
	q := r.URL.Query()
	f := findingFilter{Kind: q.Get("kind"), State: q.Get("state"), Period: q.Get("period"), Customer: q.Get("customer")}
	f.Before, _ = strconv.ParseInt(q.Get("before"), 10, 64)
	return f
}

func (f findingFilter) query(before int64) string {
	v := url.Values{}
	for k, x := range map[string]string{"kind": f.Kind, "state": f.State, "period": f.Period, "customer": f.Customer} {
		if x != "" {
			v.Set(k, x)
		}
	}
	if before > 0 {
		v.Set("before", strconv.FormatInt(before, 10))
	}
	return v.Encode()
}

func (s *Server) findings(w http.ResponseWriter, r *http.Request) {
	f := s.filterOf(r)
	rows, err := listFindings(r.Context(), s.db, findingQuery{findingFilter: f, Limit: s.cfg.PageSize + 1})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data := map[string]any{"F": f, "Kinds": audit.Kinds, "States": []audit.State{audit.StateOpen, audit.StateRefunded,
		audit.StateResolved, audit.StateDismissed}}
	if len(rows) > s.cfg.PageSize {
		rows = rows[:s.cfg.PageSize]
		data["Older"] = "/findings?" + f.query(rows[len(rows)-1].ID)
	}
	if f.Before > 0 {
		data["Newest"] = "/findings?" + f.query(0)
	}
	data["Rows"] = rows
	s.render(w, r, http.StatusOK, "findings", data)
}

func (s *Server) findingID(w http.ResponseWriter, r *http.Request) (findingRow, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.NotFound(w, r)
		return findingRow{}, false
	}
	f, err := getFinding(r.Context(), s.db, id)
	if errors.Is(err, audit.ErrNotFound) {
		http.NotFound(w, r)
		return f, false
	}
	if err != nil {
		s.fail(w, r, err)
		return f, false
	}
	return f, true
}

// chargeView is a charge as Stripe shows it now (re-read, when the console
// has a Stripe key), with its dashboard link.
type chargeView struct {
	Role, ID, URL string
	Read          bool
	Status        string
	Amount        string
	Refunded      string
	Disputed      bool
	Created       time.Time
	Error         string
}

func (s *Server) charges(ctx context.Context, roles [][2]string) []chargeView {
	var out []chargeView
	seen := map[string]bool{}
	for _, rc := range roles {
		role, id := rc[0], rc[1]
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		cv := chargeView{Role: role, ID: id, URL: s.chargeURL(id)}
		if s.cfg.Stripe != nil {
			ch, err := s.cfg.Stripe.GetCharge(ctx, id)
			switch {
			case errors.Is(err, stripeapi.ErrNoSuchCharge):
				cv.Error = "Stripe has no such charge"
			case err != nil:
				cv.Error = redact.String(err.Error())
			default:
				cv.Read, cv.Status, cv.Disputed, cv.Created = true, ch.Status, ch.Disputed, ch.Created
				cv.Amount, cv.Refunded = money(ch.AmountCents, ch.Currency), money(ch.AmountRefundedCents, ch.Currency)
			}
		}
		out = append(out, cv)
	}
	return out
}

func (s *Server) finding(w http.ResponseWriter, r *http.Request) {
	f, ok := s.findingID(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	data := map[string]any{"F": f, "Refundable": f.Kind == string(audit.KindDuplicate) && f.State == string(audit.StateOpen) && s.cfg.Auditor != nil,
		"Closable": f.State == string(audit.StateOpen), "Resolvable": f.State == string(audit.StateOpen) || f.State == string(audit.StateDismissed)}
	var err error
	if f.CustomerID != "" && f.BillingPeriod != "" {
		if data["Row"], err = getLedgerRow(ctx, s.db, f.CustomerID, f.BillingPeriod); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if data["History"], err = listActions(ctx, s.db, 0, findingTarget(f.ID), s.cfg.PageSize); err != nil {
		s.fail(w, r, err)
		return
	}
	data["Charges"] = s.charges(ctx, [][2]string{{"this finding's charge", f.ChargeID}, {"canonical (kept)", f.CanonicalChargeID}})
	s.render(w, r, http.StatusOK, "finding", data)
}

func (s *Server) confirmFinding(w http.ResponseWriter, r *http.Request) {
	f, ok := s.findingID(w, r)
	if !ok {
		return
	}
	action := r.URL.Query().Get("action")
	if action != actRefund && action != actDismiss && action != actResolve {
		http.NotFound(w, r)
		return
	}
	data, err := s.findingConfirm(r, f, action, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "confirm", data)
}

// findingConfirm is the confirmation page of an action on a finding: what
// it does in words, and a form with a one-time token (token, when the page
// is shown again after a refused submit: the same form, not a new one).
func (s *Server) findingConfirm(r *http.Request, f findingRow, action, token string) (map[string]any, error) {
	data := map[string]any{"F": f, "Action": action, "Post": fmt.Sprintf("/findings/%d/%s", f.ID, action),
		"Back": fmt.Sprintf("/findings/%d", f.ID)}
	if s.cfg.AllowActions {
		if token == "" {
			var err error
			if token, err = s.auth.actionToken(r.Context(), who(r).User, action, findingTarget(f.ID)); err != nil {
				return nil, err
			}
		}
		data["Token"] = token
	}
	switch action {
	case actRefund:
		n, cents, err := s.rolling(r.Context())
		if err != nil {
			return nil, err
		}
		data["Title"] = fmt.Sprintf("Refund %s of duplicate charge %s", money(f.AmountCents, f.Currency), f.ChargeID)
		data["Button"] = "Refund " + money(f.AmountCents, f.Currency)
		data["What"] = fmt.Sprintf("Refund %s of charge %s, the duplicate of %s (which is kept). The auditor's refund path re-reads both charges at Stripe under the key's ledger lock first and refuses if either changed.",
			money(f.AmountCents, f.Currency), f.ChargeID, f.CanonicalChargeID)
		data["Cap"] = fmt.Sprintf("Refunded in the last 24 h, by every refunder: %d refunds, %s (the rolling cap is the auditor's --max-refunds-24h / --max-cents-24h).",
			n, money(cents, f.Currency))
		data["Danger"] = true
	case actDismiss:
		data["Title"], data["Button"] = fmt.Sprintf("Dismiss finding %d (%s)", f.ID, f.Kind), "Dismiss the finding"
		data["What"] = fmt.Sprintf("Dismiss finding %d (%s): it is not a problem. Audit runs never reopen it.", f.ID, f.Kind)
	case actResolve:
		data["Title"], data["Button"] = fmt.Sprintf("Resolve finding %d (%s)", f.ID, f.Kind), "Mark it resolved"
		data["What"] = fmt.Sprintf("Resolve finding %d (%s): it was handled by hand.", f.ID, f.Kind)
	}
	return data, nil
}

func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("stream")
	if name == "" {
		name = s.cfg.Streams[0].Name
	}
	st, err := s.stream(name)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	reason := q.Get("reason")
	if refuseStreamID(w, "after", q.Get("after")) {
		return
	}
	rows, next, err := s.deadPage(r.Context(), st.Name, reason, q.Get("after"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data := map[string]any{"Stream": st.Name, "Streams": s.cfg.Streams, "Reason": reason, "Rows": rows}
	if next != "" {
		data["Next"] = "/dead?stream=" + url.QueryEscape(st.Name) + "&reason=" + url.QueryEscape(reason) + "&after=" + url.QueryEscape(next)
	}
	s.render(w, r, http.StatusOK, "dead", data)
}

func (s *Server) confirmReplay(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st, err := s.stream(q.Get("stream"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if refuseStreamID(w, "id", q.Get("id")) {
		return
	}
	data, err := s.replayConfirm(r, st, q.Get("id"), q.Get("reason"), "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "confirm", data)
}

// meterReplayWords say what a replay of a meter stream's dead letter does.
const meterReplayWords = "A meter consumer decides each from the meter ledger: an event Stripe refused (failed) or parked is recorded " +
	"again (queued, with a consumer run with --send-from-ledger) and sent under its identifier; one already delivered is acked " +
	"without a call; one Stripe may have counted and no longer guards is refused again (meter_replay_refused) until it is settled. " +
	"This can add usage at Stripe."

// replayConfirm is the confirmation page of a replay: one dead letter (id)
// or every one of a reason.
func (s *Server) replayConfirm(r *http.Request, st Stream, id, reason, token string) (map[string]any, error) {
	action := actReplay
	data := map[string]any{"Post": "/dead/replay", "Stream": st.Name, "DeadID": id, "ReasonFilter": reason, "Danger": true,
		"Back": "/dead?stream=" + url.QueryEscape(st.Name) + "&reason=" + url.QueryEscape(reason)}
	if id != "" {
		data["Title"], data["Button"] = "Replay dead letter "+id, "Replay this dead letter"
		data["What"] = fmt.Sprintf("Replay dead letter %s onto %s. The consumer bills it if the ledger has no final row for its customer and period: this can charge.", id, st.Name)
	} else {
		action = actReplayReason
		n, err := s.countReason(r.Context(), st.Name, reason, s.cfg.MaxReplay)
		if err != nil {
			return nil, err
		}
		data["Title"] = fmt.Sprintf("Replay every dead letter of reason “%s”", reason)
		data["Button"], data["Count"] = fmt.Sprintf("Replay %d dead letter%s", n, plural(n)), n
		data["What"] = fmt.Sprintf("Replay %d dead letter%s of reason %q onto %s (at most %d in one action). Each is billed if the ledger has no final row for it: this can charge.",
			n, plural(n), reason, st.Name, s.cfg.MaxReplay)
	}
	if st.Meter && id != "" {
		data["What"] = fmt.Sprintf("Replay dead letter %s onto %s. %s", id, st.Name, meterReplayWords)
	} else if st.Meter {
		data["What"] = fmt.Sprintf("Replay %d dead letter%s of reason %q onto %s (at most %d in one action). %s",
			data["Count"], plural(data["Count"].(int)), reason, st.Name, s.cfg.MaxReplay, meterReplayWords)
	}
	data["Action"] = action
	if s.cfg.AllowActions {
		if token == "" {
			var err error
			if token, err = s.auth.actionToken(r.Context(), who(r).User, action, replayTarget(st.Name, id, reason)); err != nil {
				return nil, err
			}
		}
		data["Token"] = token
	}
	return data, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// extraField is a ledger column the console does not name.
type extraField struct{ Name, Value string }

func (s *Server) customer(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cust, period := strings.TrimSpace(q.Get("customer")), strings.TrimSpace(q.Get("period"))
	data := map[string]any{"Customer": cust, "Period": period}
	if cust == "" {
		s.render(w, r, http.StatusOK, "customer", data)
		return
	}
	ctx := r.Context()
	ps, err := customerPeriods(ctx, s.db, cust, q.Get("before"), s.cfg.PageSize+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(ps) > s.cfg.PageSize {
		ps = ps[:s.cfg.PageSize]
		data["Older"] = "/customer?customer=" + url.QueryEscape(cust) + "&period=" + url.QueryEscape(period) + "&before=" + url.QueryEscape(ps[len(ps)-1].Period)
	}
	data["Periods"] = ps
	if period == "" && len(ps) > 0 {
		period = ps[0].Period
		data["Period"] = period
	}
	row, err := getLedgerRow(ctx, s.db, cust, period)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data["Row"] = row
	roles := [][2]string{}
	if row != nil {
		roles = append(roles, [2]string{"the ledger's charge", row.ChargeID})
		var extra []extraField
		for k, v := range row.Extra {
			val := "—" // SQL NULL
			if v != nil {
				val = redact.String(fmt.Sprint(v))
			}
			extra = append(extra, extraField{k, val})
		}
		sort.Slice(extra, func(i, j int) bool { return extra[i].Name < extra[j].Name })
		data["Extra"] = extra
		data["LastError"] = redact.String(row.LastError)
		data["Entries"] = s.entriesOf(ctx, row.StreamMessageID)
	}
	fs, err := listFindings(ctx, s.db, findingQuery{findingFilter: findingFilter{Customer: cust, Period: period}, Limit: s.cfg.PageSize})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data["Findings"] = fs
	var targets []string
	for _, f := range fs {
		roles = append(roles, [2]string{fmt.Sprintf("finding %d (%s)", f.ID, f.Kind), f.ChargeID})
		targets = append(targets, findingTarget(f.ID))
	}
	dead, truncated, err := s.deadOf(ctx, cust, period)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data["Dead"], data["DeadTruncated"], data["Scan"] = dead, truncated, s.cfg.DeadLetterScan
	for _, d := range dead {
		targets = append(targets, replayTarget(d.Stream, d.ID, ""))
	}
	if data["History"], err = actionsOn(ctx, s.db, targets, s.cfg.PageSize); err != nil {
		s.fail(w, r, err)
		return
	}
	data["Charges"] = s.charges(ctx, roles)
	s.render(w, r, http.StatusOK, "customer", data)
}

func (s *Server) actions(w http.ResponseWriter, r *http.Request) {
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	rows, err := listActions(r.Context(), s.db, before, "", s.cfg.PageSize+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data := map[string]any{}
	if len(rows) > s.cfg.PageSize {
		rows = rows[:s.cfg.PageSize]
		data["Older"] = "/actions?before=" + strconv.FormatInt(rows[len(rows)-1].ID, 10)
	}
	data["Rows"] = rows
	s.render(w, r, http.StatusOK, "actions", data)
}

func (s *Server) actionPage(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	a, err := getAction(r.Context(), s.db, id)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	data := map[string]any{"A": a}
	if n, ok := strings.CutPrefix(a.Target, "finding:"); ok {
		data["Link"] = "/findings/" + n
	}
	s.render(w, r, http.StatusOK, "action", data)
}
