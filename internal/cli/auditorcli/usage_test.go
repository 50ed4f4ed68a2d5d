package auditorcli

import (
	"context"
	"encoding/json"
	"github.com/jackc/pgx/v5"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestUsageCommand: an event pelguard delivered and a second sender's
// event in the same hour; `usage --usage-stable-checks 1` reports the
// over-count (exit 1), `usage-findings` lists it with the correction it
// calls for, and bad usage flags stop at start.
func TestUsageCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_calls"}); err != nil {
		t.Fatal(err)
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: "sk_test_usagecmd", BaseURL: sim.URL()})
	if err != nil {
		t.Fatal(err)
	}
	ml, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ml.EnsurePartitions(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Add(-3 * time.Hour).Truncate(time.Hour).Add(10 * time.Minute)
	ev := event.MeterEvent{EventName: "api_calls", StripeCustomerID: "cus_u", Value: 8, Timestamp: ts, EventID: "e1"}
	id := ev.Identifier("test")
	cl, err := ml.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: id, Owner: "t", Lease: time.Minute, MessageID: "1-0"}})
	if err != nil || !cl[0].Decision.MaySend() {
		t.Fatalf("reserve: %v %+v", err, cl)
	}
	for _, e := range []stripeapi.MeterEvent{
		{EventName: "api_calls", StripeCustomerID: "cus_u", Value: 8, Identifier: id, Timestamp: ts},
		{EventName: "api_calls", StripeCustomerID: "cus_u", Value: 2, Identifier: "someone-else", Timestamp: ts},
	} {
		if _, err := sc.SendMeterEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ml.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Delivered}}); err != nil {
		t.Fatal(err)
	}
	// Delivered two hours ago: a window is compared once its last delivery
	// is older than --usage-settle-delay.
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "meter_events"}.Sanitize()+
		` SET first_sent_at = now() - interval '2 hours', delivered_at = now() - interval '2 hours' WHERE identifier = $1`, id); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := call("usage", "--json", "--database-url", url, "--db-schema", schema, "--stripe-key", "sk_test_usagecmd",
		"--stripe-api-base", sim.URL(), "--usage-stable-checks", "1", "--wait-for-deps", "0")
	if code != 1 {
		t.Fatalf("usage: exit %d, want 1 (open findings)\n%s", code, stderr)
	}
	var rep struct {
		OpenFindings int `json:"open_findings"`
		Findings     []struct {
			Kind         string `json:"kind"`
			LedgerValue  int64  `json:"ledger_value"`
			StripeValue  int64  `json:"stripe_value"`
			ManualAction string `json:"manual_action"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("usage --json: %v\n%s", err, stdout)
	}
	if rep.OpenFindings != 1 || rep.Findings[0].Kind != "usage_over" || rep.Findings[0].LedgerValue != 8 || rep.Findings[0].StripeValue != 10 {
		t.Fatalf("want one usage_over 8 vs 10, got %+v", rep)
	}
	code, stdout, stderr = call("usage-findings", "--database-url", url, "--db-schema", schema)
	if code != 0 || !strings.Contains(stdout, "usage_over") || !strings.Contains(stdout, "value -2") {
		t.Fatalf("usage-findings: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for name, args := range map[string][]string{
		"hourly under a day":     {"usage", "--usage-hourly-for", "2h", "--stripe-key", "sk_test_x"},
		"usage without schedule": {"--usage", "--stripe-key", "sk_test_x"},
		"bad state":              {"usage-findings", "--state", "nope"},
	} {
		if code, _, stderr := call(args...); code != 2 || !strings.Contains(stderr, "usage") {
			t.Errorf("%s: exit %d, stderr %q", name, code, stderr)
		}
	}
}
