package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/stripeapi"
)

// SQL of the usage reconciliation (migration 00015).

func (s *Store) startUsageRun(ctx context.Context, sp usageSpan, now time.Time) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO {schema}.usage_runs (started_at, hourly_from, daily_from, compared_to)
		VALUES ($1, $2, $3, $4) RETURNING id`, now, sp.hourlyFrom, sp.dailyFrom, sp.to).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("starting a usage run: %w", err)
	}
	return id, nil
}

func (s *Store) finishUsageRun(ctx context.Context, rep UsageReport, runErr error, now time.Time) error {
	var msg *string
	if runErr != nil {
		m := redact.String(runErr.Error())
		msg = &m
	}
	_, err := s.pool.Exec(ctx, `UPDATE {schema}.usage_runs SET finished_at = $2, windows_compared = $3, requests = $4, error = $5
		WHERE id = $1`, rep.RunID, now, rep.WindowsCompared, rep.Requests, msg)
	if err != nil {
		return fmt.Errorf("finishing usage run %d: %w", rep.RunID, err)
	}
	return nil
}

// clearUsageStage removes run's staged windows (0: every run's).
func (s *Store) clearUsageStage(ctx context.Context, run int64) error {
	var err error
	if run == 0 {
		_, err = s.pool.Exec(ctx, `TRUNCATE {schema}.usage_stage`)
	} else {
		_, err = s.pool.Exec(ctx, `DELETE FROM {schema}.usage_stage WHERE run_id = $1`, run)
	}
	if err != nil {
		return fmt.Errorf("clearing the usage stage: %w", err)
	}
	return nil
}

// analyzeUsageStage gives the planner the stage's size: it was empty a
// moment ago.
func (s *Store) analyzeUsageStage(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `ANALYZE {schema}.usage_stage`); err != nil {
		return fmt.Errorf("analyzing the usage stage: %w", err)
	}
	return nil
}

func (s *Store) stagedMeters(ctx context.Context, run int64) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT event_name FROM {schema}.usage_stage WHERE run_id = $1 ORDER BY 1`, run)
	if err != nil {
		return nil, fmt.Errorf("reading the staged meters: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the staged meters: %w", err)
	}
	return names, nil
}

// usageStagePage reads the staged windows of the next limit customers of
// eventName after the customer after, in customer order, each with the
// corrections of the window not confirmed yet (their units, negative and
// positive) and the last correction's time.
func (s *Store) usageStagePage(ctx context.Context, run int64, eventName, after string, limit int) (map[string][]stagedWindow, error) {
	// MATERIALIZED: the customers are picked once, not once per row (a
	// stage without statistics made that plan quadratic).
	rows, err := s.pool.Query(ctx, `WITH c AS MATERIALIZED (
			SELECT DISTINCT stripe_customer_id FROM {schema}.usage_stage
			WHERE run_id = $1 AND event_name = $2 AND stripe_customer_id > $3 ORDER BY 1 LIMIT $4)
		SELECT s.stripe_customer_id, s.window_start, s.window_end, s.value::bigint, s.events,
			s.unknown_low::bigint, s.unknown_high::bigint, s.unknown_events, s.last_delivery,
			coalesce(k.low, 0)::bigint, coalesce(k.high, 0)::bigint, k.last
		FROM {schema}.usage_stage s JOIN c USING (stripe_customer_id)
		LEFT JOIN LATERAL (SELECT
				sum(least(u.units, 0)) FILTER (WHERE u.status IN ('recorded', 'unknown')) AS low,
				sum(greatest(u.units, 0)) FILTER (WHERE u.status IN ('recorded', 'unknown')) AS high,
				max(coalesce(u.sent_at, u.recorded_at)) AS last
			FROM {schema}.usage_corrections u
			WHERE u.event_name = $2 AND u.stripe_customer_id = s.stripe_customer_id
				AND u.window_start >= s.window_start AND u.window_end <= s.window_end) k ON true
		WHERE s.run_id = $1 AND s.event_name = $2 ORDER BY 1, 2`, run, eventName, after, limit)
	if err != nil {
		return nil, fmt.Errorf("reading staged usage of %s: %w", eventName, err)
	}
	out := map[string][]stagedWindow{}
	var c string
	var w stagedWindow
	var lastDelivery, lastCorrection *time.Time
	_, err = pgx.ForEachRow(rows, []any{&c, &w.start, &w.end, &w.value, &w.events, &w.unknownLow, &w.unknownHigh, &w.unknownEvents,
		&lastDelivery, &w.correctionLow, &w.correctionHigh, &lastCorrection}, func() error {
		w.start, w.end = w.start.UTC(), w.end.UTC()
		w.lastDelivery, w.lastCorrection = time.Time{}, time.Time{}
		if lastDelivery != nil {
			w.lastDelivery = lastDelivery.UTC()
		}
		if lastCorrection != nil {
			w.lastCorrection = lastCorrection.UTC()
		}
		out[c] = append(out[c], w)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading staged usage of %s: %w", eventName, err)
	}
	return out, nil
}

type observed struct {
	suspect  int
	opened   []int64
	resolved []UsageFinding
}

// observeUsage stores one page's comparisons: every differing window is
// inserted or seen again (a resolved one comes back as suspect; a
// dismissed one is left alone), differences seen stable times in a row
// open, and the live findings of the compared ranges that no longer differ
// are resolved. An hour's finding inside a day that differs is resolved as
// superseded by the day's, unless it was corrected: then it waits until the
// day agrees, and keeps the day's own correction away (usage_correct.go).
func (s *Store) observeUsage(ctx context.Context, run int64, m stripeapi.Meter, measure string, results []customerResult, stable int, now time.Time) (observed, error) {
	var o observed
	var dc, dkind, rc []string
	var dws, dwe, rf, rt []time.Time
	var dled, dst, dlo, dhi []int64
	var dnote, dearly, hc []string
	var hws, hwe []time.Time
	for _, r := range results {
		for _, x := range r.ranges {
			rc, rf, rt = append(rc, r.customer), append(rf, x[0]), append(rt, x[1])
		}
		for _, x := range r.held {
			hc, hws, hwe = append(hc, r.customer), append(hws, x[0]), append(hwe, x[1])
		}
		for _, d := range r.diffs {
			kind := UsageOver
			if d.stripe < d.low {
				kind = UsageUnder
			}
			dc, dws, dwe, dkind = append(dc, r.customer), append(dws, d.start), append(dwe, d.end), append(dkind, string(kind))
			dled, dst = append(dled, d.ledger), append(dst, d.stripe)
			dlo, dhi, dnote = append(dlo, d.low-d.ledger), append(dhi, d.high-d.ledger), append(dnote, d.unknownNote)
			dearly = append(dearly, d.early)
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return o, fmt.Errorf("storing usage findings: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if len(dc) > 0 {
		_, err := tx.Exec(ctx, `INSERT INTO {schema}.usage_findings AS f (event_name, meter_id, stripe_customer_id, window_start,
				window_end, kind, measure, ledger_value, stripe_value, unknown_low, unknown_high, unknown_note, early_note,
				first_seen_run_id, last_seen_run_id, created_at, updated_at)
			SELECT $1, $2, c, ws, we, kind, $3, lv, sv, lo, hi, nullif(note, ''), nullif(early, ''), $4, $4, $5, $5
			FROM unnest($6::text[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::bigint[], $11::bigint[],
				$12::bigint[], $13::bigint[], $14::text[], $15::text[]) AS t(c, ws, we, kind, lv, sv, lo, hi, note, early)
			ON CONFLICT (event_name, stripe_customer_id, window_start, window_end) DO UPDATE SET
				checks = CASE WHEN f.state <> 'resolved' AND f.ledger_value = excluded.ledger_value
					AND f.stripe_value = excluded.stripe_value AND f.unknown_low = excluded.unknown_low
					AND f.unknown_high = excluded.unknown_high THEN f.checks + 1 ELSE 1 END,
				kind = excluded.kind, meter_id = excluded.meter_id, measure = excluded.measure,
				ledger_value = excluded.ledger_value, stripe_value = excluded.stripe_value,
				unknown_low = excluded.unknown_low, unknown_high = excluded.unknown_high, unknown_note = excluded.unknown_note,
				early_note = excluded.early_note,
				-- One finding is one difference: another kind or amount is
				-- decided again (its correction, its manual action).
				manual_action = CASE WHEN f.kind = excluded.kind AND f.ledger_value = excluded.ledger_value
					AND f.stripe_value = excluded.stripe_value AND f.unknown_low = excluded.unknown_low
					AND f.unknown_high = excluded.unknown_high AND f.state <> 'resolved' THEN f.manual_action END,
				state = CASE WHEN f.state = 'resolved' THEN 'suspect' ELSE f.state END,
				opened_at = CASE WHEN f.state = 'resolved' THEN NULL ELSE f.opened_at END,
				resolved_at = CASE WHEN f.state = 'resolved' THEN NULL ELSE f.resolved_at END,
				resolution = CASE WHEN f.state = 'resolved' THEN NULL ELSE f.resolution END,
				last_seen_run_id = excluded.last_seen_run_id, updated_at = excluded.updated_at
			WHERE f.state <> 'dismissed'`,
			m.EventName, m.ID, measure, run, now, dc, dws, dwe, dkind, dled, dst, dlo, dhi, dnote, dearly)
		if err != nil {
			return o, fmt.Errorf("storing %d usage differences of %s: %w", len(dc), m.EventName, err)
		}
		rows, err := tx.Query(ctx, `UPDATE {schema}.usage_findings SET state = 'open', opened_at = $3, updated_at = $3
			WHERE event_name = $1 AND last_seen_run_id = $2 AND state = 'suspect' AND checks >= $4 RETURNING id`,
			m.EventName, run, now, stable)
		if err != nil {
			return o, fmt.Errorf("opening stable usage findings: %w", err)
		}
		if o.opened, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return o, fmt.Errorf("opening stable usage findings: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM {schema}.usage_findings
			WHERE event_name = $1 AND last_seen_run_id = $2 AND state = 'suspect' AND stripe_customer_id = ANY($3)`,
			m.EventName, run, dc).Scan(&o.suspect); err != nil {
			return o, fmt.Errorf("counting suspect usage windows: %w", err)
		}
	}
	if len(rc) > 0 {
		rows, err := tx.Query(ctx, `WITH d AS (
				SELECT * FROM unnest($4::text[], $5::timestamptz[], $6::timestamptz[]) AS t(c, ws, we)
			), x AS (
				SELECT f.id, EXISTS (SELECT 1 FROM d WHERE d.c = f.stripe_customer_id AND d.ws <= f.window_start
					AND d.we >= f.window_end) AS superseded,
					EXISTS (SELECT 1 FROM {schema}.usage_corrections uc WHERE uc.finding_id = f.id) AS corrected
				FROM {schema}.usage_findings f
				JOIN unnest($7::text[], $8::timestamptz[], $9::timestamptz[]) AS r(c, rf, rt)
					ON f.stripe_customer_id = r.c AND f.window_start >= r.rf AND f.window_end <= r.rt
				WHERE f.event_name = $1 AND f.state IN ('suspect', 'open')
					AND NOT EXISTS (SELECT 1 FROM d WHERE d.c = f.stripe_customer_id AND d.ws = f.window_start AND d.we = f.window_end)
					-- A window whose delivery has not settled was not compared.
					AND NOT EXISTS (SELECT 1 FROM unnest($10::text[], $11::timestamptz[], $12::timestamptz[]) AS h(c, ws, we)
						WHERE h.c = f.stripe_customer_id AND h.ws < f.window_end AND h.we > f.window_start)
			)
			UPDATE {schema}.usage_findings f SET state = 'resolved', resolved_at = $3, updated_at = $3, last_seen_run_id = $2,
				manual_action = NULL, -- a resolved finding shows its resolution, not its old advice
				resolution = CASE WHEN x.superseded THEN 'superseded by the finding of its day'
					WHEN x.corrected THEN 'totals agree after the correction'
					WHEN f.opened_at IS NULL THEN 'totals agreed before the difference was stable'
					ELSE 'totals agree' END
			FROM x WHERE f.id = x.id AND NOT (x.superseded AND x.corrected)
			RETURNING `+usageFindingCols("f"),
			m.EventName, run, now, dc, dws, dwe, rc, rf, rt, hc, hws, hwe)
		if err != nil {
			return o, fmt.Errorf("resolving usage findings of %s: %w", m.EventName, err)
		}
		fs, err := pgx.CollectRows(rows, scanUsageFinding)
		if err != nil {
			return o, fmt.Errorf("resolving usage findings of %s: %w", m.EventName, err)
		}
		for _, f := range fs {
			if f.Resolution != "totals agreed before the difference was stable" {
				o.resolved = append(o.resolved, f)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return o, fmt.Errorf("storing usage findings: %w", err)
	}
	return o, nil
}

func usageFindingCols(a string) string {
	return a + `.id, ` + a + `.kind, ` + a + `.state, ` + a + `.event_name, ` + a + `.meter_id, ` + a + `.stripe_customer_id, ` +
		a + `.window_start, ` + a + `.window_end, ` + a + `.measure, ` + a + `.ledger_value::bigint, ` + a + `.stripe_value::bigint, ` +
		a + `.checks, coalesce(` + a + `.resolution, ''), coalesce(` + a + `.manual_action, ''), ` +
		a + `.unknown_low::bigint, ` + a + `.unknown_high::bigint, coalesce(` + a + `.unknown_note, ''), coalesce(` + a + `.early_note, '')`
}

func scanUsageFinding(row pgx.CollectableRow) (UsageFinding, error) {
	var f UsageFinding
	var kind string
	err := row.Scan(&f.ID, &kind, &f.State, &f.EventName, &f.MeterID, &f.StripeCustomerID, &f.WindowStart, &f.WindowEnd,
		&f.Measure, &f.LedgerValue, &f.StripeValue, &f.Checks, &f.Resolution, &f.ManualAction, &f.UnknownLow, &f.UnknownHigh, &f.Unknown, &f.Early)
	f.Kind, f.WindowStart, f.WindowEnd = UsageKind(kind), f.WindowStart.UTC(), f.WindowEnd.UTC()
	f.ManualAction = manualText(f.ManualAction)
	return f, err
}

// UsageFilter selects usage findings; zero fields match everything.
type UsageFilter struct {
	State            string // suspect, open, resolved, dismissed
	Kind             UsageKind
	EventName        string
	StripeCustomerID string
	Limit            int // default 1000
}

// UsageFindings lists usage findings, oldest window first.
func (s *Store) UsageFindings(ctx context.Context, f UsageFilter) ([]UsageFinding, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+usageFindingCols("f")+` FROM {schema}.usage_findings f
		WHERE ($1 = '' OR f.state = $1) AND ($2 = '' OR f.kind = $2) AND ($3 = '' OR f.event_name = $3)
			AND ($4 = '' OR f.stripe_customer_id = $4)
		ORDER BY f.window_start, f.event_name, f.stripe_customer_id, f.id LIMIT $5`,
		f.State, string(f.Kind), f.EventName, f.StripeCustomerID, max(f.Limit, 0)+boolInt(f.Limit == 0)*1000)
	if err != nil {
		return nil, fmt.Errorf("listing usage findings: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanUsageFinding)
	if err != nil {
		return nil, fmt.Errorf("listing usage findings: %w", err)
	}
	return out, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// usageOpenTotals counts the open usage findings and their drift (the sum
// of |Stripe − ledger|), per kind.
func (s *Store) usageOpenTotals(ctx context.Context) (map[UsageKind]int, map[UsageKind]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT kind, count(*), coalesce(sum(greatest(stripe_value - ledger_value - unknown_high,
			ledger_value + unknown_low - stripe_value, 0)), 0)::bigint
		FROM {schema}.usage_findings WHERE state = 'open' GROUP BY kind`)
	if err != nil {
		return nil, nil, fmt.Errorf("counting open usage findings: %w", err)
	}
	n, units := map[UsageKind]int{}, map[UsageKind]int64{}
	var kind string
	var c int
	var u int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &c, &u}, func() error {
		n[UsageKind(kind)], units[UsageKind(kind)] = c, u
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("counting open usage findings: %w", err)
	}
	return n, units, nil
}

// DismissUsageFinding closes an open or suspect usage finding by hand: the
// runs neither report nor correct it again.
func (s *Store) DismissUsageFinding(ctx context.Context, id int64, reason string, now time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE {schema}.usage_findings SET state = 'dismissed', resolved_at = $2, updated_at = $2,
		resolution = $3 WHERE id = $1 AND state IN ('suspect', 'open')`, id, now, "dismissed: "+reason)
	if err != nil {
		return fmt.Errorf("dismissing usage finding %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("usage finding %d: %w", id, ErrState)
	}
	return nil
}
