package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

// The Ledger page and the banner (issue 26): a ledger that went back in time
// (a failover to an asynchronous replica, a restore) is detected, fenced and
// repaired from Stripe by the fleet; the console shows each rollback, its
// repair and what was rebuilt, and every page says so while one is open.

// maxWitnesses bounds the witness table of the Ledger page.
const maxWitnesses = 200

// missingTable is a ledger without migration 00012's tables (or schema).
func missingTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000")
}

// span is a duration to the second (to the millisecond under one):
// 850ms, 42s, 2m15s, 3h05m, 2d04h.
func span(d time.Duration) string {
	if d < 0 {
		return "0s"
	}
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	if d = d.Round(time.Second); d < time.Minute {
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
	if d < time.Hour {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	if d = d.Round(time.Minute); d < 48*time.Hour {
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	h := int(d.Round(time.Hour).Hours())
	return fmt.Sprintf("%dd%02dh", h/24, h%24)
}

// Repair states of a rollback.
const (
	repairOpen     = "open"
	repairRunning  = "repairing"
	repairFinished = "repaired"
)

// rollbackView is a rollback as the pages show it: its state, the
// durations from the console's clock, its texts redacted.
type rollbackView struct {
	rollbackRow
	Lost  []string // the evidence, one witness a line
	State string   // repairOpen, repairRunning or repairFinished
	Took  string   // repaired: from detection to repaired_at
	For   string   // open: since detection; repairing: since the repair started
}

// Counted is whether a repair recorded what it rebuilt (a rollback that a
// later detection re-opened keeps its earlier repair's counts).
func (v rollbackView) Counted() bool {
	return v.RowsRebuilt+v.RowsRepaired+v.RefundsRebuilt+v.Findings > 0
}

func (s *Server) viewRollback(r rollbackRow) rollbackView {
	v := rollbackView{rollbackRow: r}
	v.Evidence, v.Report, v.LastError = redact.String(r.Evidence), redact.String(r.Report), redact.String(r.LastError)
	for _, l := range strings.Split(v.Evidence, "; ") {
		if l = strings.TrimSpace(l); l != "" {
			v.Lost = append(v.Lost, l)
		}
	}
	switch {
	case r.Repaired != nil:
		v.State, v.Took = repairFinished, span(r.Repaired.Sub(r.DetectedAt))
	case r.RepairStarted != nil:
		v.State, v.For = repairRunning, span(s.now().Sub(*r.RepairStarted))
	default:
		v.State, v.For = repairOpen, span(s.now().Sub(r.DetectedAt))
	}
	return v
}

func (s *Server) ledgerPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	data := map[string]any{}
	rows, err := listRollbacks(ctx, s.db, before, s.cfg.PageSize+1)
	if missingTable(err) {
		data["Missing"] = true
		s.render(w, r, http.StatusOK, "ledger", data)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(rows) > s.cfg.PageSize {
		rows = rows[:s.cfg.PageSize]
		data["Older"] = "/ledger?before=" + strconv.FormatInt(rows[len(rows)-1].ID, 10)
	}
	if before > 0 {
		data["Newest"] = "/ledger"
	}
	views := make([]rollbackView, len(rows))
	for i, row := range rows {
		views[i] = s.viewRollback(row)
	}
	data["Rows"] = views
	ws, err := listWitnesses(ctx, s.db, maxWitnesses+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(ws) > maxWitnesses {
		ws, data["WitnessesCut"] = ws[:maxWitnesses], maxWitnesses
	}
	idle := make([]string, len(ws))
	for i, x := range ws {
		idle[i] = span(s.now().Sub(x.LastCommit))
	}
	data["Witnesses"], data["Idle"] = ws, idle
	if data["Fence"], err = getFence(ctx, s.db); err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "ledger", data)
}

// lastRollback is the overview's line: the newest rollback, nil if none;
// missing when the ledger has no migration 00012.
func (s *Server) lastRollback(ctx context.Context) (v *rollbackView, missing bool, err error) {
	rows, err := listRollbacks(ctx, s.db, 0, 1)
	if missingTable(err) {
		return nil, true, nil
	}
	if err != nil || len(rows) == 0 {
		return nil, false, err
	}
	x := s.viewRollback(rows[0])
	return &x, false, nil
}

// banner reads the open rollback for the banner of every page. It never
// fails a page: a ledger without migration 00012, or a failed read, shows
// no banner.
func (s *Server) banner(ctx context.Context) *openRollback {
	o, err := getOpenRollback(ctx, s.db)
	if err != nil {
		if !missingTable(err) && ctx.Err() == nil {
			s.log.Warn("reading the open ledger rollback for the banner", "error", err)
		}
		return nil
	}
	return o
}

// pausedBanner lists the streams whose billing an operator paused
// (pelguard-consumer pause): every page says so while one is.
func (s *Server) pausedBanner(ctx context.Context) []streamfacts.Pause {
	ps, err := streamfacts.Pauses(ctx, s.cfg.DB, s.db.Schema())
	if err != nil {
		if !missingTable(err) && ctx.Err() == nil {
			s.log.Warn("reading the paused streams for the banner", "error", err)
		}
		return nil
	}
	return ps
}
