package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

// Pausing and resuming a stream's billing from the console: the change
// `pelguard-consumer pause` and `resume` make (streamfacts.SetPaused, in
// stream_pauses and stream_fact_changes), behind the console's guard for
// every action (--allow-actions, a named person, CSRF, a confirmation page
// with a required reason and a one-time token), recorded in
// console_actions, and sent to Slack as the CLI's stream_paused alert.

const (
	actPause  = "pause"
	actResume = "resume"
)

func pauseTarget(st Stream) string { return "stream:" + st.Name + " group=" + st.Group }

// pauseActor is who the pause records: the person, and that it came from
// the console.
func pauseActor(user string) string { return "console:" + user }

// streamState is one stream of the pause page.
type streamState struct {
	Stream
	Paused *streamfacts.Pause
}

// pausePage is GET /pause: every stream the console shows, paused or not,
// with a button to change it.
func (s *Server) pausePage(w http.ResponseWriter, r *http.Request) {
	ps, err := streamfacts.Pauses(r.Context(), s.cfg.DB, s.db.Schema())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]streamState, 0, len(s.cfg.Streams))
	for _, st := range s.cfg.Streams {
		ss := streamState{Stream: st}
		for i := range ps {
			if ps[i].Stream == st.Name && ps[i].Group == st.Group {
				ss.Paused = &ps[i]
			}
		}
		out = append(out, ss)
	}
	s.render(w, r, http.StatusOK, "pause", map[string]any{"Streams": out})
}

// confirmPause is GET /pause/confirm?stream=S&do=pause|resume.
func (s *Server) confirmPause(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st, err := s.stream(q.Get("stream"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	action := q.Get("do")
	if action != actPause && action != actResume {
		http.NotFound(w, r)
		return
	}
	data, err := s.pauseConfirm(r, st, action, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "confirm", data)
}

func (s *Server) pauseConfirm(r *http.Request, st Stream, action, token string) (map[string]any, error) {
	kind := "charges"
	if st.Meter {
		kind = "usage (meter events)"
	}
	data := map[string]any{"Post": "/pause", "Back": "/pause", "Action": action,
		"Hidden": []extraField{{Name: "stream", Value: st.Name}, {Name: "do", Value: action}}}
	if action == actPause {
		data["Title"], data["Button"], data["Danger"] = "Pause billing from "+st.Name, "Pause billing", true
		data["What"] = fmt.Sprintf("Pause billing from %s (group %s, %s), fleet-wide: within about a second every consumer and re-drive of it stops calling Stripe. "+
			"Events wait on the stream; nothing is lost or billed twice when it is resumed.", st.Name, st.Group, kind)
		data["Cap"] = "A long pause has costs: past 23 h, an event whose Stripe outcome was unknown at the pause is looked up at Stripe (charges) or parked (meter events) on resume; " +
			"past 35 days, Stripe no longer takes the usage."
	} else {
		data["Title"], data["Button"] = "Resume billing from "+st.Name, "Resume billing"
		data["What"] = fmt.Sprintf("Resume billing from %s (group %s, %s): its consumers read and bill again where they stopped.", st.Name, st.Group, kind)
	}
	if s.cfg.AllowActions {
		if token == "" {
			var err error
			if token, err = s.auth.actionToken(r.Context(), who(r).User, action, pauseTarget(st)); err != nil {
				return nil, err
			}
		}
		data["Token"] = token
	}
	return data, nil
}

// doPause is POST /pause: pause (do=pause) or resume (do=resume) a stream.
func (s *Server) doPause(w http.ResponseWriter, r *http.Request) {
	st, err := s.stream(r.PostFormValue("stream"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	action := r.PostFormValue("do")
	if action != actPause && action != actResume {
		http.Error(w, "do must be pause or resume", http.StatusBadRequest)
		return
	}
	target := pauseTarget(st)
	if !s.auth.validToken(r.Context(), r.PostFormValue("token"), who(r).User, action, target) {
		http.Error(w, "forbidden: this form was not made for you and this action (open the confirmation page again)", http.StatusForbidden)
		return
	}
	why, ok := reasonOf(r)
	if !ok {
		data, err := s.pauseConfirm(r, st, action, r.PostFormValue("token"))
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
		user := who(r).User
		outcome, detail := s.setPaused(ctx, st, action == actPause, user, why)
		if outcome == outDone {
			// What the CLI sends, once: the console's own record of the
			// action is its row and the alert's fields.
			a := alerts.StreamPaused(st.Name, st.Group, action == actPause, pauseActor(user), why)
			a.Fields = append(a.Fields, alerts.Field{Label: "Console action", Value: strconv.FormatInt(aid, 10)})
			s.record(ctx, aid, user, action, target, outcome, detail)
			s.cfg.Notifier.Notify(a)
		} else {
			s.finish(ctx, aid, user, action, target, why, outcome, detail)
		}
	}
	http.Redirect(w, r, "/actions/"+strconv.FormatInt(aid, 10), http.StatusSeeOther)
}

func (s *Server) setPaused(ctx context.Context, st Stream, pause bool, user, why string) (outcome, detail string) {
	err := streamfacts.SetPaused(ctx, s.cfg.DB, s.db.Schema(), st.Name, st.Group, pause, pauseActor(user), why)
	switch {
	case errors.Is(err, streamfacts.ErrAlreadyPaused):
		return outRefused, fmt.Sprintf("%s (group %s) was already paused: nothing changed", st.Name, st.Group)
	case errors.Is(err, streamfacts.ErrNotPaused):
		return outRefused, fmt.Sprintf("%s (group %s) was not paused: nothing changed", st.Name, st.Group)
	case err != nil:
		return outFailed, err.Error()
	case pause:
		return outDone, fmt.Sprintf("paused billing from %s (group %s): no consumer or re-drive of it calls Stripe until it is resumed", st.Name, st.Group)
	}
	return outDone, fmt.Sprintf("resumed billing from %s (group %s)", st.Name, st.Group)
}
