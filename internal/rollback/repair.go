package rollback

import (
	"context"
	"fmt"
	"time"

	"github.com/pelguard/pelguard/alerts"
)

// tryRepair claims the open rollbacks (or those whose claim went stale),
// repairs from their earliest loss, and closes them, unless a detection
// re-opened them meanwhile (its claim is then gone and a later pass
// repairs again).
func (m *Monitor) tryRepair(ctx context.Context) {
	now := m.cfg.Clock.Now().Truncate(time.Microsecond)
	if now.Before(m.repairAt) {
		return
	}
	rows, err := m.db.Query(ctx, `UPDATE {schema}.ledger_rollbacks SET repair_started_at = $1, repaired_by = $2
		WHERE repaired_at IS NULL AND (repair_started_at IS NULL OR repair_started_at < $3)
		RETURNING id, lost_since, detected_at`, now, m.cfg.Writer, now.Add(-repairStale))
	if err != nil {
		m.cfg.Logger.Warn("claiming the ledger's repair", "err", err)
		return
	}
	var ids []int64
	detected := map[int64]time.Time{}
	var since time.Time
	for rows.Next() {
		var id int64
		var lost, at time.Time
		if err := rows.Scan(&id, &lost, &at); err != nil {
			rows.Close()
			m.cfg.Logger.Warn("claiming the ledger's repair", "err", err)
			return
		}
		ids, detected[id] = append(ids, id), at
		if since.IsZero() || lost.Before(since) {
			since = lost
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return
	}
	var found time.Time
	for _, at := range detected {
		if at.After(found) {
			found = at
		}
	}
	m.cfg.Logger.Info("repairing the ledger from Stripe", "rollbacks", ids, "since", since)
	rep, err := m.cfg.Repair(WithFoundAt(ctx, found), since)
	if err != nil {
		m.repairGap = min(max(2*m.repairGap, 5*time.Second), 5*time.Minute)
		m.repairAt = now.Add(m.repairGap)
		m.cfg.Logger.Error("repairing the ledger from Stripe failed; retrying", "rollbacks", ids, "err", err, "retry_in", m.repairGap)
		_, _ = m.db.Exec(context.WithoutCancel(ctx), `UPDATE {schema}.ledger_rollbacks SET last_error = left($3, 1000), repair_started_at = NULL
			WHERE id = ANY($1) AND repair_started_at = $2`, ids, now, err.Error())
		return
	}
	m.repairGap = 0
	done := m.cfg.Clock.Now()
	// The pass's work is recorded even when a detection re-opened the
	// rollback meanwhile (its claim is gone): the rows it restored are in
	// the ledger, and the next pass, finding them there, restores nothing
	// — its counts alone would under-report the repair. The report keeps
	// every pass's notes, oldest first.
	add := func(n int) string { // the pass's counts and notes, from parameter $n on
		return fmt.Sprintf(`rows_rebuilt = rows_rebuilt + $%d, rows_repaired = rows_repaired + $%d, refunds_rebuilt = refunds_rebuilt + $%d,
			findings = findings + $%d, report = left(concat_ws(E'\n', nullif(report, ''), $%d::text), 4000), last_error = NULL`, n, n+1, n+2, n+3, n+4)
	}
	rows, err = m.db.Query(context.WithoutCancel(ctx), `UPDATE {schema}.ledger_rollbacks SET repaired_at = $3, repairs = repairs + 1, `+add(4)+`
		WHERE id = ANY($1) AND repair_started_at = $2 AND repaired_at IS NULL
		RETURNING id, repairs, rows_rebuilt, rows_repaired, refunds_rebuilt, findings, coalesce(report, '')`,
		ids, now, done, rep.Rebuilt, rep.Repaired, rep.RefundsRebuilt, rep.Findings, rep.Notes)
	if err != nil {
		m.cfg.Logger.Error("recording the ledger's repair", "err", err)
		return
	}
	type closed struct {
		id, repairs                                 int64
		rebuilt, repaired, refundsRebuilt, findings int
		report                                      string
	}
	var all []closed
	for rows.Next() {
		var c closed
		if err := rows.Scan(&c.id, &c.repairs, &c.rebuilt, &c.repaired, &c.refundsRebuilt, &c.findings, &c.report); err != nil {
			rows.Close()
			m.cfg.Logger.Error("recording the ledger's repair", "err", err)
			return
		}
		all = append(all, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		m.cfg.Logger.Error("recording the ledger's repair", "err", err)
		return
	}
	if len(all) == 0 {
		if _, err := m.db.Exec(context.WithoutCancel(ctx), `UPDATE {schema}.ledger_rollbacks SET `+add(2)+`
			WHERE id = ANY($1) AND repaired_at IS NULL`, ids, rep.Rebuilt, rep.Repaired, rep.RefundsRebuilt, rep.Findings, rep.Notes); err != nil {
			m.cfg.Logger.Error("recording the ledger's repair", "err", err)
		}
		m.metrics.rebuilt.Add(float64(rep.Rebuilt + rep.Repaired))
		m.cfg.Logger.Warn("the ledger's repair finished but a new detection re-opened it; repairing again", "rollbacks", ids,
			"rebuilt", rep.Rebuilt, "repaired", rep.Repaired, "findings", rep.Findings)
		return
	}
	m.metrics.rebuilt.Add(float64(rep.Rebuilt + rep.Repaired))
	for _, c := range all {
		took := done.Sub(detected[c.id])
		m.cfg.Logger.Info("the ledger is repaired from Stripe", "rollback", c.id, "rebuilt", c.rebuilt, "repaired", c.repaired,
			"refunds_rebuilt", c.refundsRebuilt, "findings", c.findings, "took", took.Round(time.Millisecond).String())
		// Repaired again after more evidence re-opened it: announced
		// again only if this pass changed or found something.
		again := c.repairs > 1 && rep.Rebuilt+rep.Repaired+rep.RefundsRebuilt+rep.Findings == 0
		if m.cfg.Notifier != nil && !again {
			m.cfg.Notifier.Notify(alerts.LedgerRepaired(c.id, c.rebuilt, c.repaired, c.refundsRebuilt, c.findings, took, c.report))
		}
	}
	if err := m.check(ctx, m.db.Pool); err != nil {
		m.cfg.Logger.Warn("checking the ledger after its repair", "err", err)
	}
}

type foundAtKey struct{}

// WithFoundAt tells a RepairFunc when the rollbacks it repairs were found
// (their latest detection): the ledger took writes elsewhere by then, so
// an event whose stream entry was added later was never sent before the
// loss (the usage repair counts those apart).
func WithFoundAt(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, foundAtKey{}, at)
}

// FoundAt is WithFoundAt's time (zero: not known).
func FoundAt(ctx context.Context) time.Time {
	at, _ := ctx.Value(foundAtKey{}).(time.Time)
	return at
}
