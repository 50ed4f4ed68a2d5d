package rollback

import (
	"context"
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
	m.cfg.Logger.Info("repairing the ledger from Stripe", "rollbacks", ids, "since", since)
	rep, err := m.cfg.Repair(ctx, since)
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
	tag, err := m.db.Exec(context.WithoutCancel(ctx), `UPDATE {schema}.ledger_rollbacks SET repaired_at = $3,
			rows_rebuilt = rows_rebuilt + $4, rows_repaired = rows_repaired + $5, refunds_rebuilt = refunds_rebuilt + $6,
			findings = findings + $7, report = left($8, 4000), last_error = NULL
		WHERE id = ANY($1) AND repair_started_at = $2 AND repaired_at IS NULL`,
		ids, now, done, rep.Rebuilt, rep.Repaired, rep.RefundsRebuilt, rep.Findings, rep.Notes)
	if err != nil {
		m.cfg.Logger.Error("recording the ledger's repair", "err", err)
		return
	}
	if tag.RowsAffected() == 0 {
		m.cfg.Logger.Warn("the ledger's repair finished but a new detection re-opened it; repairing again", "rollbacks", ids)
		return
	}
	m.metrics.rebuilt.Add(float64(rep.Rebuilt + rep.Repaired))
	for _, id := range ids {
		took := done.Sub(detected[id])
		m.cfg.Logger.Info("the ledger is repaired from Stripe", "rollback", id, "rebuilt", rep.Rebuilt, "repaired", rep.Repaired,
			"refunds_rebuilt", rep.RefundsRebuilt, "findings", rep.Findings, "took", took.Round(time.Millisecond).String())
		if m.cfg.Notifier != nil {
			m.cfg.Notifier.Notify(alerts.LedgerRepaired(id, rep.Rebuilt, rep.Repaired, rep.RefundsRebuilt, rep.Findings, took, rep.Notes))
		}
	}
	if err := m.check(ctx, m.db.Pool); err != nil {
		m.cfg.Logger.Warn("checking the ledger after its repair", "err", err)
	}
}
