package chaos

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/stripesim"
)

// The drill's auditor must be able to refund every duplicate the largest
// drill can make: production's per-run and rolling 24 h caps (30 refunds,
// 3,000.00) stopped a 120-event run short (issue 25, item 8).
func TestAuditConfigLiftsEveryRefundCap(t *testing.T) {
	t.Parallel()
	sim, err := stripesim.New(stripesim.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	c := &cell{sim: sim, mode: ModeNaive, schema: "chaos_x_1"}
	cfg := c.auditConfig()
	// The most the drill can ask: 10,000 events, each charged (a naive
	// run) several times over, at up to 50.00.
	const maxDups, maxCents = 10 * 10_000, 10 * 10_000 * 5_000
	if cfg.MaxRefunds24h < maxDups || cfg.MaxRefunds < maxDups {
		t.Errorf("refund count caps %d per run, %d per 24 h: the drill can make %d duplicates", cfg.MaxRefunds, cfg.MaxRefunds24h, maxDups)
	}
	if cfg.MaxCents24h < maxCents || cfg.MaxCents < maxCents {
		t.Errorf("refund cents caps %d per run, %d per 24 h: the drill can double-charge %d", cfg.MaxCents, cfg.MaxCents24h, maxCents)
	}
	if audit.DefaultMaxRefunds24h >= maxDups {
		t.Fatal("the production default changed: this test no longer shows the drill lifting it")
	}
}

// A run past the default rolling cap (partial-batch makes more than 30
// naive duplicates at 120 events) refunds every duplicate it made.
func TestDrillRefundsPastTheRollingCap(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cfg := testConfig(t, 99)
	cfg.Events = 120
	cfg.Scenarios = []string{ScenarioPartialBatch}
	// Warnings only: debug lines for every charge through t.Log cost more
	// than the run itself at 120 events.
	cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) { t.Log(strings.TrimRight(string(p), "\n")) }),
		&slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("120 events, partial-batch: %s", time.Since(start).Round(time.Millisecond))
	naive := rep.Results[0]
	if naive.Mode != ModeNaive || naive.DuplicateCharges <= audit.DefaultMaxRefunds24h {
		t.Fatalf("naive row %+v: want more than %d duplicates, past the default rolling cap", naive, audit.DefaultMaxRefunds24h)
	}
	if naive.Refunded != naive.DuplicateCharges || naive.NetDuplicates != 0 || naive.RefundStoppedBy != "" {
		t.Errorf("refunded %d of %d duplicates, %d left, stopped by %q", naive.Refunded, naive.DuplicateCharges, naive.NetDuplicates, naive.RefundStoppedBy)
	}
	if f := rep.Failures(); len(f) > 0 {
		t.Errorf("failures: %s", strings.Join(f, "; "))
	}
}
