package console

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/reaper"
)

// ReaperPolicy is the reaper's decision settings, which the PEL page judges
// entries by: they must be the running reaper's (its --min-idle,
// --max-deliveries, --stopped-consumers, the event rules, --external-ledger).
// The page says when the reaper's last recorded pass used other ones.
type ReaperPolicy struct {
	MinIdle          time.Duration // default reaper.DefaultMinIdle
	MaxDeliveries    int64         // default reaper.DefaultMaxDeliveries
	StoppedConsumers []string
	Rules            event.Rules
	ExternalLedger   string
	ExternalMaxCall  time.Duration
	// Namespace is the meter consumers' (in every meter event's
	// identifier), for meter streams; default consumer.DefaultNamespace.
	Namespace string
}

// newExplainer is a dry-run reaper over the console's streams: never
// started, never passing, asked only for Explain. A dry run makes no
// Stripe call and writes nothing.
func newExplainer(cfg Config) (*reaper.Reaper, error) {
	var sgs, meters []reaper.StreamGroup
	for _, st := range cfg.Streams {
		if st.Meter {
			meters = append(meters, reaper.StreamGroup{Stream: st.Name, Group: st.Group})
		} else {
			sgs = append(sgs, reaper.StreamGroup{Stream: st.Name, Group: st.Group})
		}
	}
	p := cfg.Reaper
	r, err := reaper.New(reaper.Config{Redis: cfg.Redis, DB: cfg.DB, Schema: cfg.Schema, Streams: sgs, MeterStreams: meters, DryRun: true,
		Name: "console-explain", MinIdle: p.MinIdle, MaxDeliveries: p.MaxDeliveries, StoppedConsumers: p.StoppedConsumers,
		Rules: p.Rules, ExternalLedger: p.ExternalLedger, ExternalMaxCall: p.ExternalMaxCall, Namespace: p.Namespace,
		Lease:  time.Hour, // only for New's heartbeat warning: a dry run holds nothing
		Logger: slog.New(slog.DiscardHandler), Clock: cfg.Clock})
	if err != nil {
		return nil, fmt.Errorf("the PEL page's reaper policy: %w", err)
	}
	return r, nil
}

// pelRow is one pending entry with the reaper's verdict.
type pelRow struct {
	ID, Consumer string
	Idle         time.Duration
	Deliveries   int64
	Kind         string
	Do           string // what the reaper would do, in words
	Key, Reason  string
	Detail       string // the dead letter's detail, for the kinds that dead-letter
	Due          bool
	Owner        consumerState // the owner's state, as the overview says it
	Row          *reaper.RowState
}

// verdictWords says what a pass does with each kind.
var verdictWords = map[reaper.Kind]string{
	reaper.KindGone:          "ack: the body was trimmed or deleted",
	reaper.KindInvalid:       "dead letter + ack: the body is invalid",
	reaper.KindAlreadyBilled: "ack without redelivery: the ledger row is final",
	reaper.KindConflict:      "dead letter + ack: the ledger row is final with other business fields",
	reaper.KindLeaseLive:     "leave it: a live ledger lease (slow, not dead)",
	reaper.KindMaxDeliveries: "dead letter + ack + alert: delivered too often",
	reaper.KindClaim:         "claim (min-idle fence) and re-drive through the consumer's code",
	reaper.KindUnregistered:  "leave it: its owner never registered as a pelguard consumer",
	reaper.KindInFlight:      "leave it: being re-driven",
}

// pelPage is the PEL of one stream, paged by entry id, each entry with what
// the reaper would decide now: reaper.Explain on the page, read-only.
func (s *Server) pelPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st, err := s.stream(cmp.Or(q.Get("stream"), s.cfg.Streams[0].Name))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	ctx := r.Context()
	owner, after := strings.TrimSpace(q.Get("consumer")), q.Get("after")
	if refuseStreamID(w, "after", after) {
		return
	}
	data := map[string]any{"Stream": st.Name, "Group": st.Group, "Streams": s.cfg.Streams, "Owner": owner, "After": after,
		"Policy": s.explainer.Policy(), "Refresh": s.refresh(r)}
	rows, next, err := s.pelRows(ctx, st, owner, after)
	if err != nil {
		data["Error"] = redact.String(err.Error())
	}
	data["Rows"] = rows
	if next != "" {
		data["Next"] = "/pel?" + url.Values{"stream": {st.Name}, "consumer": {owner}, "after": {next}}.Encode()
	}
	kinds := map[string]int{}
	for _, row := range rows {
		kinds[row.Kind]++
	}
	var counts []kindN
	for k, n := range kinds {
		counts = append(counts, kindN{k, n})
	}
	sort.Slice(counts, func(i, j int) bool {
		return counts[i].N > counts[j].N || counts[i].N == counts[j].N && counts[i].Kind < counts[j].Kind
	})
	data["Counts"] = counts
	if sum, err := s.cfg.Redis.XPending(ctx, st.Name, st.Group).Result(); err == nil {
		data["Total"] = sum.Count
	}
	if st.Meter {
		// With --send-from-ledger the backlog is the ledger's, not the PEL's.
		b, err := backlogOfStream(ctx, s.db, st.Name)
		if err != nil && !missingTable(err) {
			data["Error"] = redact.String(err.Error())
		}
		data["Meter"], data["Backlog"], data["Now"] = true, b, s.now()
	}
	if passes, err := reaper.RecentPasses(ctx, s.cfg.Redis, st.Name, 1); err == nil && len(passes) == 1 {
		p, pol := passes[0], s.explainer.Policy()
		data["LastPass"] = p
		data["PolicyDiffers"] = p.MinIdle != pol.MinIdle || p.MaxDeliveries != pol.MaxDeliveries
	}
	s.render(w, r, http.StatusOK, "pel", data)
}

type kindN struct {
	Kind string
	N    int
}

// pelRows reads one page of st's PEL (owner's alone when set), after the
// entry id after, and explains it.
func (s *Server) pelRows(ctx context.Context, st Stream, owner, after string) ([]pelRow, string, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	pend, err := s.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: st.Name, Group: st.Group,
		Start: start, End: "+", Count: int64(s.cfg.PageSize) + 1, Consumer: owner}).Result()
	if redis.HasErrorPrefix(err, "NOGROUP") {
		return nil, "", fmt.Errorf("no such stream or group")
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading the PEL of %s: %w", st.Name, err)
	}
	next := ""
	if len(pend) > s.cfg.PageSize {
		pend = pend[:s.cfg.PageSize]
		next = pend[len(pend)-1].ID
	}
	xs, err := s.explainer.Explain(ctx, st.Name, pend)
	if err != nil {
		return nil, "", err
	}
	beats, err := consumer.Registered(ctx, s.cfg.Redis, st.Name, st.Group)
	if err != nil {
		return nil, "", err
	}
	now := s.now()
	out := make([]pelRow, len(xs))
	for i, x := range xs {
		d := x.Decision
		row := pelRow{ID: d.ID, Consumer: d.Consumer, Idle: d.Idle, Deliveries: d.Deliveries, Kind: string(d.Kind),
			Do: verdictWords[d.Kind], Key: d.Key, Reason: redact.String(truncate(d.Reason, 300)), Detail: redact.String(truncate(x.Detail, 300)),
			Due: x.Due, Row: x.Row}
		if x.Row != nil && x.Row.Meter != "" && x.Row.Status == "queued" {
			// Recorded at ingest and not sent: acking the entry loses
			// nothing, the senders send the row from the ledger.
			row.Do = "ack: the event is recorded in the meter ledger (queued), not sent yet; the consumers' senders send it from there"
		}
		t, ok := beats[d.Consumer]
		row.Owner = s.stateOf(st, d.Consumer, ok, max(0, now.Sub(t)))
		out[i] = row
	}
	return out, next, nil
}

// refresh is the meta refresh of a live page, in seconds (0: none).
func (s *Server) refresh(r *http.Request) int {
	if s.cfg.Refresh < 0 || r.URL.Query().Get("refresh") == "0" {
		return 0
	}
	return max(1, int(s.cfg.Refresh.Seconds()))
}
