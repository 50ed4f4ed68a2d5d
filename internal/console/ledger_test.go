package console

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/streamfacts"
)

// rollback inserts a ledger_rollbacks row as the rollback package writes
// it (migration 00012) and returns its id.
func (b *bundle) rollback(t testing.TB, r rollbackRow) int64 {
	t.Helper()
	var id int64
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO {schema}.ledger_rollbacks (detected_at, detected_by, evidence,
			lost_since, epoch_floor, rows_fenced, repair_started_at, repaired_at, repaired_by, rows_rebuilt, rows_repaired,
			refunds_rebuilt, findings, report, last_error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), $10, $11, $12, $13, nullif($14, ''), nullif($15, ''))
		RETURNING id`, r.DetectedAt, r.DetectedBy, r.Evidence, r.LostSince, r.EpochFloor, r.RowsFenced, r.RepairStarted,
		r.Repaired, r.RepairedBy, r.RowsRebuilt, r.RowsRepaired, r.RefundsRebuilt, r.Findings, r.Report, r.LastError).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *bundle) witness(t testing.TB, writer string, seq int64, at time.Time) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO {schema}.ledger_witness (writer, seq, updated_at) VALUES ($1, $2, $3)`,
		writer, seq, at); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

var bannerRe = regexp.MustCompile(`(?s)<p class="banner" id="rollback-banner">(.*?)</p>`)

// banner is the page's rollback banner, "" when it has none.
func banner(page string) string {
	if m := bannerRe.FindStringSubmatch(page); m != nil {
		return m[1]
	}
	return ""
}

// bannerPages are the pages a person sees the banner on.
var bannerPages = []string{"/", "/findings?state=open", "/dead", "/customer?customer=c1", "/actions", "/ledger"}

// Issue 26: the console shows a ledger rollback, its repair and what was
// rebuilt; every page carries a banner while one is open, and none once it
// is repaired.
func TestLedgerShowsRollbacksAndTheirRepair(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	c := b.login(t, "alice")

	if over := c.mustGet("/"); !strings.Contains(over, "no rollback recorded") || banner(over) != "" {
		t.Fatalf("a ledger with no rollback: line or banner wrong:\n%s", over)
	}
	if page := c.mustGet("/ledger"); !strings.Contains(page, "No rollback recorded") || banner(page) != "" {
		t.Fatalf("ledger page of a ledger with no rollback:\n%s", page)
	}

	b.witness(t, "consumer-a", 120, now.Add(-10*time.Second))
	b.witness(t, "reaper-1", 7, now.Add(-3*time.Minute))
	b.witness(t, "auditor-1", 3, now.Add(-2*time.Hour))
	old := now.Add(-30 * time.Hour)
	repaired := b.rollback(t, rollbackRow{DetectedAt: old, DetectedBy: "consumer-a",
		Evidence: "consumer-a: ledger at 90, witnessed 125 (35 commits lost)", LostSince: old.Add(-5 * time.Minute),
		EpochFloor: 1 << 32, RowsFenced: 41, RepairStarted: ptr(old.Add(4 * time.Second)), Repaired: ptr(old.Add(2*time.Minute + 15*time.Second)),
		RepairedBy: "auditor-1", RowsRebuilt: 35, RowsRepaired: 12, RefundsRebuilt: 2, Findings: 3,
		Report: "rebuilt 35 charged rows from Stripe\nkey 1f2e fully refunded at Stripe: finding"})
	detected := now.Add(-2 * time.Minute)
	open := b.rollback(t, rollbackRow{DetectedAt: detected, DetectedBy: "reaper-1",
		Evidence:  "consumer-<b>x</b>: ledger at 5, witnessed 9 (4 commits lost); reaper-1: ledger at 0, witnessed 7 (7 commits lost)",
		LostSince: detected.Add(-7 * time.Minute), EpochFloor: 2 << 32, RowsFenced: 6,
		LastError: "listing charges since 11:51: Stripe said 500 for key sk_live_abcdef123456"})

	page := c.mustGet("/ledger")
	for _, want := range []string{
		// newest first: the open one, then the repaired one
		fmt.Sprintf("Rollback #%d", open), fmt.Sprintf("Rollback #%d", repaired),
		// the repaired one: when, by whom, how long from detection, what it rebuilt
		"<dt>detected</dt><dd>2026-11-30 06:00:00Z by <span class=\"mono\">consumer-a</span>", "repaired at 2026-11-30 06:02:15Z by <span class=\"mono\">auditor-1</span>, taking <b>2m15s</b> from detection",
		"35 rows rebuilt · 12 rows repaired · 2 refunds rebuilt ·", `<a href="/findings?state=open">3 findings</a>`,
		"not yet: the repair records what it rebuilt when it finishes",
		"41 rows and leases moved past epoch floor 4294967296", "repair reads Stripe from</dt><dd>2026-11-30 05:55:00Z",
		"rebuilt 35 charged rows from Stripe\nkey 1f2e fully refunded",
		// the open one: what was lost (escaped, one witness a line), for how long, why the repair has not finished
		"<li>consumer-&lt;b&gt;x&lt;/b&gt;: ledger at 5, witnessed 9 (4 commits lost)</li>", "<li>reaper-1: ledger at 0, witnessed 7 (7 commits lost)</li>",
		"2026-12-01 11:58:00Z by <span class=\"mono\">reaper-1</span>", "open for 2m00s", "the last attempt failed and is retried",
		"listing charges since 11:51: Stripe said 500",
		"6 rows and leases moved past epoch floor 8589934592",
		// the witnesses, newest commit first
		"<td class=\"mono\">consumer-a</td><td class=\"n\">120</td><td>2026-12-01 11:59:50Z</td><td class=\"n\">10s</td>",
		"<td class=\"mono\">auditor-1</td><td class=\"n\">3</td><td>2026-12-01 10:00:00Z</td><td class=\"n\">2h00m</td>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("ledger page lacks %q", want)
		}
	}
	if i, j := strings.Index(page, fmt.Sprintf("Rollback #%d", open)), strings.Index(page, fmt.Sprintf("Rollback #%d", repaired)); i > j {
		t.Error("the ledger page does not list the newest rollback first")
	}
	if i, j := strings.Index(page, ">consumer-a<"), strings.Index(page, ">auditor-1<"); i > j || i < 0 {
		t.Error("the witness table is not newest commit first")
	}
	if strings.Contains(page, "<b>x</b>") || strings.Contains(page, "sk_live_abcdef123456") {
		t.Error("the ledger page shows evidence unescaped or a key")
	}

	wantBanner := "<b>The ledger lost commits</b> (detected 2026-12-01 11:58:00Z by reaper-1): every charge asks Stripe first and refunds wait until the repair from Stripe finishes."
	for _, path := range bannerPages {
		got := banner(c.mustGet(path))
		if !strings.Contains(got, wantBanner) || !strings.Contains(got, `<a href="/ledger">`) || !strings.Contains(got, "The last repair attempt failed; it is retried.") {
			t.Errorf("%s: banner %q", path, got)
		}
	}
	if login := b.anon(t).get("/login"); banner(login.body) != "" {
		t.Error("the login page tells an anonymous visitor about the ledger")
	}
	if over := c.mustGet("/"); !strings.Contains(over, fmt.Sprintf(`last <a href="/ledger#rollback-%d">#%d</a> detected 2026-12-01 11:58:00Z by reaper-1`, open, open)) ||
		!strings.Contains(over, "open for 2m00s") {
		t.Errorf("overview line: %s", over)
	}

	// A process claims the repair.
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.ledger_rollbacks SET repair_started_at = $2, repaired_by = 'auditor-1', last_error = NULL
		WHERE id = $1`, open, now.Add(-30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if page := c.mustGet("/ledger"); !strings.Contains(page, `repairing since 2026-12-01 11:59:30Z by <span class="mono">auditor-1</span> (30s)`) {
		t.Errorf("ledger page of a repair under way:\n%s", page)
	}
	if got := banner(c.mustGet("/findings")); !strings.Contains(got, "The repair is running since 2026-12-01 11:59:30Z (auditor-1)") {
		t.Errorf("banner of a repair under way: %q", got)
	}

	// It finishes: no banner anywhere, the overview says what it did.
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.ledger_rollbacks SET repaired_at = $2, rows_rebuilt = 4, rows_repaired = 7
		WHERE id = $1`, open, now); err != nil {
		t.Fatal(err)
	}
	for _, path := range bannerPages {
		if got := banner(c.mustGet(path)); got != "" {
			t.Errorf("%s: banner after the repair: %q", path, got)
		}
	}
	over := c.mustGet("/")
	if !strings.Contains(over, "repaired at 2026-12-01 12:00:00Z taking 2m00s: 4 rows rebuilt, 7 repaired, 0 refunds rebuilt, 0 findings") {
		t.Errorf("overview line after the repair: %s", over)
	}
	if page := c.mustGet("/ledger"); strings.Contains(page, "open for") || strings.Count(page, ">repaired</span>") != 2 {
		t.Errorf("ledger page after the repair:\n%s", page)
	}
}

// A console pointed at a ledger without migration 00012 shows no banner
// and says what is missing; no page fails.
func TestLedgerWithoutRollbackTables(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if _, err := b.pool.Exec(context.Background(), `DROP TABLE {schema}.ledger_rollbacks, {schema}.ledger_witness, {schema}.ledger_fence`); err != nil {
		t.Fatal(err)
	}
	c := b.login(t, "alice")
	for _, path := range bannerPages {
		r := c.get(path)
		if r.code != http.StatusOK || banner(r.body) != "" {
			t.Errorf("%s: %d, banner %q", path, r.code, banner(r.body))
		}
	}
	if over := c.mustGet("/"); !strings.Contains(over, "no rollback tables (migration 00012 not applied)") {
		t.Error("the overview does not say the rollback tables are missing")
	}
	if page := c.mustGet("/ledger"); !strings.Contains(page, "no rollback tables yet") {
		t.Error("the ledger page does not say the rollback tables are missing")
	}
}

// The banner's query runs on every page: it reads the open rollbacks
// through ledger_rollbacks_open_idx, not the table's whole history, and
// names the oldest open one.
func TestBannerReadsTheOpenIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO {schema}.ledger_rollbacks (detected_at, detected_by, evidence, lost_since, epoch_floor, repaired_at)
		SELECT $1::timestamptz + g * interval '1 hour', 'w' || g, 'old', $1, g, $1::timestamptz + g * interval '1 hour'
		FROM generate_series(1, 20000) g`, now.Add(-3*365*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	first := b.rollback(t, rollbackRow{DetectedAt: now.Add(-time.Minute), DetectedBy: "consumer-a", Evidence: "e", LostSince: now.Add(-time.Hour), EpochFloor: 1})
	if _, err := b.pool.Exec(ctx, `ANALYZE {schema}.ledger_rollbacks`); err != nil {
		t.Fatal(err)
	}
	var plan string
	if err := b.pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+qOpenRollback).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, `"Index Name": "ledger_rollbacks_open_idx"`) || strings.Contains(plan, `"Seq Scan"`) {
		t.Fatalf("the banner's query does not read ledger_rollbacks_open_idx:\n%s", plan)
	}
	o, err := getOpenRollback(ctx, b.pool)
	if err != nil || o == nil || o.ID != first || o.DetectedBy != "consumer-a" || o.More {
		t.Fatalf("open rollback %+v, %v; want #%d alone", o, err, first)
	}
	b.rollback(t, rollbackRow{DetectedAt: now, DetectedBy: "reaper-1", Evidence: "e", LostSince: now.Add(-time.Hour), EpochFloor: 2})
	if o, err = getOpenRollback(ctx, b.pool); err != nil || o == nil || o.ID != first || !o.More {
		t.Fatalf("two open rollbacks: %+v, %v; want #%d and more", o, err, first)
	}
}

func TestSpan(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                                           "0s",
		850 * time.Millisecond:                                 "850ms",
		42*time.Second + 400*time.Millisecond:                  "42s",
		2*time.Minute + 15*time.Second:                         "2m15s",
		59*time.Minute + 59*time.Second + 600*time.Millisecond: "1h00m",
		3*time.Hour + 5*time.Minute:                            "3h05m",
		52 * time.Hour:                                         "2d04h",
	} {
		if got := span(d); got != want {
			t.Errorf("span(%v) = %q, want %q", d, got, want)
		}
	}
}

var pausedRe = regexp.MustCompile(`(?s)<p class="banner" id="paused-banner">(.*?)</p>`)

// A paused stream (pelguard-consumer pause) is named on every page, with
// who paused it, why and the command that resumes it; no banner once
// resumed.
func TestEveryPageShowsAPausedStream(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	c := b.login(t, "alice")
	if m := pausedRe.FindStringSubmatch(c.mustGet("/")); m != nil {
		t.Fatalf("a banner with nothing paused: %s", m[1])
	}
	schema := b.pool.Schema()
	if err := streamfacts.SetPaused(ctx, b.cfg.DB, schema, "billing-stream", "billing-group", true, "oncall", "Stripe incident"); err != nil {
		t.Fatal(err)
	}
	for _, p := range bannerPages {
		m := pausedRe.FindStringSubmatch(c.mustGet(p))
		if m == nil || !strings.Contains(m[1], "billing-stream") || !strings.Contains(m[1], "oncall") ||
			!strings.Contains(m[1], "Stripe incident") || !strings.Contains(m[1], "pelguard-consumer resume --stream billing-stream") {
			t.Fatalf("%s: paused banner %q", p, m)
		}
	}
	if err := streamfacts.SetPaused(ctx, b.cfg.DB, schema, "billing-stream", "billing-group", false, "oncall", "recovered"); err != nil {
		t.Fatal(err)
	}
	if m := pausedRe.FindStringSubmatch(c.mustGet("/")); m != nil {
		t.Fatalf("a banner after the resume: %s", m[1])
	}
}
