package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// switchEvent is customer i of the switch test.
func switchEvent(i int) event.Event {
	return event.Event{CustomerID: fmt.Sprintf("c%02d", i), StripeCustomerID: fmt.Sprintf("cus_c%02d", i),
		AmountCents: int64(1000 + i), BillingPeriod: "2026-11", Currency: "usd"}
}

// The runbook "Switching from an existing consumer", step by step through
// the binaries, over the article's own Python consumer and monitor as the
// team's system. Before the switch the team billed part of the period:
// consumers were killed between Stripe's reply and their INSERT (one of
// those entries older than 24 h by the emulator's clock, so Stripe has
// forgotten its key), its monitor re-charged one of them (a duplicate the
// team made), and events were re-published. After the runbook every
// customer is charged exactly once, nothing alerts "not billed", the team's
// table is byte for byte as it was, and `auditor --legacy` finds exactly
// the team's duplicate and refunds it.
func TestSwitchingATeamByTheRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := teamsys.Setup(t)
	const n, teamBilled = 20, 12
	for i := range teamBilled {
		env.Publish(t, switchEvent(i))
	}
	teamRows := func() int { return len(env.Rows(t)) }

	// worker-a bills c00–c02 and dies after Stripe charged c03.
	if ex := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-a", KillAfterCharges: 4}).Wait(30 * time.Second); !ex.Killed() {
		t.Fatalf("worker-a: %v", ex)
	}
	// A day later the monitor reclaims c03; Stripe has forgotten the key:
	// the team charges c03 a second time.
	env.Sim.Advance(25 * time.Hour)
	if ex := env.Start(t, teamsys.Config{Role: teamsys.RoleMonitor, MinIdle: time.Millisecond, Once: true}).Wait(30 * time.Second); ex.Code != 0 {
		t.Fatalf("monitor: %v", ex)
	}
	// worker-b bills c04 and dies after Stripe charged c05; a day passes.
	if ex := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-b", KillAfterCharges: 2}).Wait(30 * time.Second); !ex.Killed() {
		t.Fatalf("worker-b: %v", ex)
	}
	env.Sim.Advance(25 * time.Hour)
	// worker-c bills c06–c11 and is stopped, as the runbook's first step.
	wc := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-c"})
	testenv.Eventually(t, 60*time.Second, func() bool { return teamRows() == teamBilled-1 }, "the team billed c00–c11 but c05")
	wc.Stop()
	if got := len(env.Charges("cus_c03", "2026-11")); got != 2 {
		t.Fatalf("the team's monitor made %d charges for c03; the scenario needs its duplicate", got)
	}
	// Re-published events: one the team recorded, one it charged unrecorded.
	env.Publish(t, switchEvent(0))
	env.Publish(t, switchEvent(5))
	teamBefore := testenv.Snapshot(t, env.DB, env.Schema)

	// The runbook, through the binaries.
	pel := "pel_" + testenv.Suffix()
	t.Cleanup(func() { _, _ = env.DB.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pel+" CASCADE") })
	pelURL := testenv.DatabaseURL() + "&search_path=" + pel
	if !strings.Contains(testenv.DatabaseURL(), "?") {
		pelURL = testenv.DatabaseURL() + "?search_path=" + pel
	}
	base := baseEnv("DATABASE_URL="+pelURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+testKey,
		"STRIPE_API_BASE="+env.Sim.URL())
	keep := []string{"--namespace", teamsys.IdempotencyNamespace, "--stripe-mode", "charges", "--charge-metadata=false"}
	streamFlag := env.Stream + "=" + env.Group
	must := func(want int, bin string, args ...string) string {
		t.Helper()
		r := runBin(t, bin, base, 2*time.Minute, args...)
		if r.code != want {
			t.Fatalf("%s %s: exit %d, want %d\n%s", bin, strings.Join(args, " "), r.code, want, r.out)
		}
		return r.out
	}
	must(0, "consumer", "migrate", "up")
	imp := must(0, "consumer", "import", "--namespace", teamsys.IdempotencyNamespace,
		"--from-table", env.Schema+".billing_records", "--from-stripe", "--period", "2026-11", "--stream", env.Stream, "--json")
	var sum struct {
		ImportedCharged int               `json:"imported_charged"`
		Duplicates      []json.RawMessage `json:"duplicates"`
	}
	if err := json.Unmarshal([]byte(imp[:strings.LastIndex(imp, "}")+1][strings.Index(imp, "{"):]), &sum); err != nil {
		t.Fatalf("import summary: %v\n%s", err, imp)
	}
	if sum.ImportedCharged != teamBilled || len(sum.Duplicates) != 1 {
		t.Fatalf("import: %d charged rows and %d duplicates, want %d and 1:\n%s", sum.ImportedCharged, len(sum.Duplicates), teamBilled, imp)
	}
	dry := must(0, "reaper", "--dry-run", "--once", "--json", "--metrics-addr", "", "--min-idle", "1ms", "--stream", streamFlag,
		"--namespace", teamsys.IdempotencyNamespace)
	if !strings.Contains(dry, `"already_billed"`) || strings.Contains(dry, `"kind":"claim"`) {
		t.Fatalf("the dry run must show the killed consumers' entries already_billed and claim none:\n%s", dry)
	}

	cons := startBin(t, "consumer", base, append([]string{"--stream", env.Stream, "--group", env.Group, "--metrics-addr", "", "--block", "100ms"}, keep...)...)
	reap := startBin(t, "reaper", base, append([]string{"--stream", streamFlag, "--metrics-addr", "", "--min-idle", "1s", "--interval", "200ms"}, keep...)...)
	for i := teamBilled; i < n; i++ {
		env.Publish(t, switchEvent(i))
	}
	l := ledger.New(env.DB, pel, nil)
	testenv.Eventually(t, 90*time.Second, func() bool {
		c, err := l.Counts(ctx)
		return err == nil && c[ledger.StatusCharged] == n && env.Pending(t) == 0
	}, "all %d customers charged in the ledger and nothing pending", n)
	out := cons.stop() + reap.stop()
	if strings.Contains(out, "charge_failed") {
		t.Fatalf("a false \"not billed\" alert:\n%s", out)
	}
	for i := range n {
		e := switchEvent(i)
		want := 1
		if i == 3 {
			want = 2 // the team's own duplicate, until the auditor refunds it
		}
		if got := len(env.Charges(e.StripeCustomerID, e.BillingPeriod)); got != want {
			t.Fatalf("%s has %d charges, want %d", e.CustomerID, got, want)
		}
	}
	if got := testenv.Snapshot(t, env.DB, env.Schema); got != teamBefore {
		t.Fatalf("the switch changed the team's table:\nbefore:\n%s\nafter:\n%s", teamBefore, got)
	}

	window := []string{"--from", env.Sim.Now().Add(-96 * time.Hour).Format(time.RFC3339), "--to", env.Sim.Now().Add(time.Minute).Format(time.RFC3339)}
	audit := runBin(t, "auditor", base, time.Minute, append([]string{"run", "--legacy", "--json"}, window...)...)
	if audit.code != 1 || strings.Count(audit.out, `"kind": "duplicate_charge"`)+strings.Count(audit.out, `"kind":"duplicate_charge"`) != 1 {
		t.Fatalf("auditor --legacy: exit %d, want exactly the team's duplicate:\n%s", audit.code, audit.out)
	}
	must(0, "auditor", "refund", "--all")
	for i := range n {
		e := switchEvent(i)
		if got := len(env.Charges(e.StripeCustomerID, e.BillingPeriod)); got != 1 {
			t.Fatalf("after the refund %s has %d charges, want 1", e.CustomerID, got)
		}
	}
	c03, err := l.Get(ctx, ledger.EventKey(switchEvent(3)))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range env.Rows(t) {
		if row.CustomerID == "c03" && row.ChargeID != c03.ChargeID {
			t.Fatalf("the ledger's c03 charge %s is not the one the team's table names (%s)", c03.ChargeID, row.ChargeID)
		}
	}
	if left := env.Charges("cus_c03", "2026-11"); len(left) != 1 || left[0].ID != c03.ChargeID {
		t.Fatalf("the refund took the canonical charge: left %+v, ledger %s", left, c03.ChargeID)
	}
}
