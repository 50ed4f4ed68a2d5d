package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/redact"
)

// Action names, as console_actions.action records them.
const (
	actRefund       = "refund"
	actDismiss      = "dismiss"
	actResolve      = "resolve"
	actReplay       = "replay"
	actReplayReason = "replay_reason"
)

// Outcomes of an action.
const (
	outDone    = "done"
	outRefused = "refused"
	outFailed  = "failed"
)

// actionTimeout bounds one action once it started: it runs detached from
// the request, so a browser that goes away mid-refund still gets its refund
// recorded.
const actionTimeout = 2 * time.Minute

func findingTarget(id int64) string { return "finding:" + strconv.FormatInt(id, 10) }

func replayTarget(stream, id, reason string) string {
	if id != "" {
		return "dead:" + stream + "/" + id
	}
	return "dead:" + stream + " reason=" + reason
}

// begin records an action before it runs. A token already recorded is a
// double submit: it returns that action's id and dup, and nothing runs.
func (s *Server) begin(ctx context.Context, r *http.Request, token, action, target, reason string) (int64, bool, error) {
	var id int64
	err := s.db.QueryRow(ctx, `INSERT INTO {schema}.console_actions (token, at, actor, action, target, reason, remote_addr)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (token) DO NOTHING RETURNING id`,
		token, s.now(), who(r).User, action, target, reason, r.RemoteAddr).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		err = s.db.QueryRow(ctx, `SELECT id FROM {schema}.console_actions WHERE token = $1`, token).Scan(&id)
		return id, true, err
	}
	if err != nil {
		return 0, false, fmt.Errorf("recording the action: %w", err)
	}
	return id, false, nil
}

// finish records the outcome and tells Slack who did what, and why.
func (s *Server) finish(ctx context.Context, id int64, user, action, target, reason, outcome, detail string) {
	detail = redact.String(detail)
	if _, err := s.db.Exec(ctx, `UPDATE {schema}.console_actions SET outcome = $2, detail = $3, finished_at = $4 WHERE id = $1`,
		id, outcome, detail, s.now()); err != nil {
		s.log.Error("recording a console action's outcome", "action_id", id, "error", err)
	}
	s.log.Info("console action", "action_id", id, "user", user, "action", action, "target", target, "outcome", outcome, "detail", detail)
	s.cfg.Notifier.Notify(alerts.Alert{
		Kind:  KindConsoleAction,
		Title: fmt.Sprintf("Console: %s — %s %s (%s)", user, action, target, outcome),
		Text:  "*Reason:* " + alerts.Escape(redact.String(reason)),
		Fields: []alerts.Field{{Label: "Who", Value: alerts.Escape(user)}, {Label: "Action", Value: action},
			{Label: "Target", Value: alerts.Escape(target)}, {Label: "Outcome", Value: outcome},
			{Label: "Detail", Value: alerts.Escape(truncate(detail, 500))}, {Label: "Console action", Value: strconv.FormatInt(id, 10)}},
		Fingerprint: "console-action-" + strconv.FormatInt(id, 10),
	})
}

// errNoReason is what a confirmation form submitted without a reason says.
const errNoReason = "A reason is required: say why you do this. It is recorded with your name and sent to Slack."

// reasonOf is the form's required reason, redacted as alerts are: a key,
// a card number or a password typed into it is never stored, shown or
// sent to Slack (pages show no secret).
func reasonOf(r *http.Request) (string, bool) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	return redact.String(truncate(reason, 1000)), reason != ""
}

// doFinding is POST /findings/{id}/{refund|dismiss|resolve}.
func (s *Server) doFinding(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 || (action != actRefund && action != actDismiss && action != actResolve) {
		http.NotFound(w, r)
		return
	}
	target := findingTarget(id)
	if !s.auth.validToken(r.Context(), r.PostFormValue("token"), who(r).User, action, target) {
		http.Error(w, "forbidden: this form was not made for you and this action (open the confirmation page again)", http.StatusForbidden)
		return
	}
	reason, ok := reasonOf(r)
	if !ok {
		// The same form again (its token was not used), saying what is missing.
		f, ok := s.findingID(w, r)
		if !ok {
			return
		}
		data, err := s.findingConfirm(r, f, action, r.PostFormValue("token"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		data["Error"] = errNoReason
		s.render(w, r, http.StatusUnprocessableEntity, "confirm", data)
		return
	}
	if action == actRefund && s.cfg.Auditor == nil {
		http.Error(w, "refunds are not configured (the console has no Stripe key)", http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	aid, dup, err := s.begin(ctx, r, r.PostFormValue("token"), action, target, reason)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !dup {
		outcome, detail := s.runFinding(ctx, who(r).User, action, id)
		s.finish(ctx, aid, who(r).User, action, target, reason, outcome, detail)
	}
	http.Redirect(w, r, "/actions/"+strconv.FormatInt(aid, 10), http.StatusSeeOther)
}

func (s *Server) runFinding(ctx context.Context, user, action string, id int64) (outcome, detail string) {
	var f audit.Finding
	var err error
	switch action {
	case actDismiss:
		f, err = s.store.Dismiss(ctx, id)
	case actResolve:
		f, err = s.store.Resolve(ctx, id)
	case actRefund:
		return s.refund(ctx, user, id)
	}
	switch {
	case errors.Is(err, audit.ErrState), errors.Is(err, audit.ErrNotFound):
		return outRefused, err.Error()
	case err != nil:
		return outFailed, err.Error()
	}
	return outDone, fmt.Sprintf("finding %d is now %s", f.ID, f.State)
}

// refund refunds one duplicate through the auditor's own path: the key's
// ledger lock, the re-read of both charges at Stripe, the rolling 24 h cap
// every refunder shares (refund_ledger), one idempotency key per charge.
func (s *Server) refund(ctx context.Context, user string, id int64) (string, string) {
	rep, err := s.cfg.Auditor.Refund(ctx, audit.RefundOptions{FindingID: id, MaxRefunds: 1, MaxCents: s.cfg.MaxRefundCents,
		LockWait: 30 * time.Second, Source: "console:" + user})
	switch {
	case errors.Is(err, audit.ErrState), errors.Is(err, audit.ErrNotFound):
		return outRefused, err.Error()
	case errors.Is(err, audit.ErrLocked):
		return outRefused, "another refund run holds the refund lock; nothing was refunded, try again"
	case err != nil:
		return outFailed, err.Error()
	case len(rep.Refunded) == 1:
		x := rep.Refunded[0]
		return outDone, fmt.Sprintf("refunded %s of duplicate %s as %s (canonical %s kept); rolling 24 h: %d of %d refunds, %s of %s",
			money(x.AmountCents, x.Currency), x.ChargeID, x.RefundID, x.CanonicalChargeID, rep.Rolling.Refunds, rep.Rolling.MaxRefunds,
			money(rep.Rolling.Cents, x.Currency), money(rep.Rolling.MaxCents, x.Currency))
	case len(rep.Skipped) == 1:
		return outRefused, fmt.Sprintf("not refunded: %s: %s", rep.Skipped[0].SkipCode, rep.Skipped[0].Skipped)
	}
	return outFailed, "the refund run reported nothing for this finding"
}

// doReplay is POST /dead/replay: one dead letter (id) or every one of a
// reason. A replayed event is billed if the ledger has no final row for it:
// it is confirmed and recorded like a refund.
func (s *Server) doReplay(w http.ResponseWriter, r *http.Request) {
	st, err := s.stream(r.PostFormValue("stream"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	deadID, reason := r.PostFormValue("id"), r.PostFormValue("reason_filter")
	if refuseStreamID(w, "id", deadID) {
		return
	}
	action := actReplay
	if deadID == "" {
		action = actReplayReason
	}
	target := replayTarget(st.Name, deadID, reason)
	if !s.auth.validToken(r.Context(), r.PostFormValue("token"), who(r).User, action, target) {
		http.Error(w, "forbidden: this form was not made for you and this action (open the confirmation page again)", http.StatusForbidden)
		return
	}
	why, ok := reasonOf(r)
	if !ok {
		data, err := s.replayConfirm(r, st, deadID, reason, r.PostFormValue("token"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		data["Error"] = errNoReason
		s.render(w, r, http.StatusUnprocessableEntity, "confirm", data)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	aid, dup, err := s.begin(ctx, r, r.PostFormValue("token"), action, target, why)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !dup {
		outcome, detail := s.replay(ctx, st, deadID, reason)
		s.finish(ctx, aid, who(r).User, action, target, why, outcome, detail)
	}
	http.Redirect(w, r, "/actions/"+strconv.FormatInt(aid, 10), http.StatusSeeOther)
}

func (s *Server) replay(ctx context.Context, st Stream, deadID, reason string) (string, string) {
	select { // one replay at a time in this process: two people replaying one reason add each entry once
	case s.replayMu <- struct{}{}:
		defer func() { <-s.replayMu }()
	case <-ctx.Done():
		return outFailed, ctx.Err().Error()
	}
	if deadID != "" {
		rep, err := consumer.ReplayDeadLetter(ctx, s.cfg.Redis, st.Name, deadID)
		switch {
		case errors.Is(err, consumer.ErrNoDeadLetter):
			return outRefused, "the dead letter is gone: replayed already, or removed"
		case err != nil:
			return outFailed, err.Error()
		}
		return outDone, fmt.Sprintf("replayed %s (source %s, %s) onto %s as %s", rep.DeadID, rep.SourceID, rep.Reason, st.Name, rep.NewID)
	}
	done, err := consumer.ReplayDeadLetters(ctx, s.cfg.Redis, st.Name, reason, s.cfg.MaxReplay, false)
	if err != nil {
		return outFailed, fmt.Sprintf("replayed %d before: %v", len(done), err)
	}
	return outDone, fmt.Sprintf("replayed %d dead letter(s) of reason %q onto %s (at most %d per action)", len(done), reason, st.Name, s.cfg.MaxReplay)
}

// rolling is the refund ledger's last 24 h, for the confirmation page (the
// refund itself re-sums it under its lock).
func (s *Server) rolling(ctx context.Context) (int, int64, error) {
	var n int
	var cents int64
	err := s.db.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM {schema}.refund_ledger
		WHERE refunded_at > $1`, s.now().Add(-24*time.Hour)).Scan(&n, &cents)
	return n, cents, err
}

// countReason counts a stream's dead letters of a reason, up to limit.
func (s *Server) countReason(ctx context.Context, stream, reason string, limit int) (int, error) {
	n := 0
	_, err := s.scanDead(ctx, stream, "-", s.cfg.DeadLetterScan, func(m redis.XMessage) bool {
		if r, _ := m.Values["reason"].(string); reason == "" || r == reason {
			n++
		}
		return n < limit
	})
	return n, err
}
