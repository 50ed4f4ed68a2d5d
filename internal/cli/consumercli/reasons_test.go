package consumercli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// TestRecordedReasonsAreRedacted: a reason an operator gives a command
// (pause --reason, namespace set --reason, meter-settle --reason) is
// recorded, and shown on the console's pages, redacted as the alerts are:
// a Stripe key or a card number pasted into it never reaches the table.
func TestRecordedReasonsAreRedacted(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	ctx := context.Background()
	const key, card = "sk_live_51HsecretKEYvalue0123", "4242 4242 4242 4242"
	reason := "customer said card " + card + " and key " + key
	stream := testenv.Name(t, "reasons")
	for _, args := range [][]string{
		{"pause", "--stream", stream, "--reason", reason, "--by", "oncall"},
		{"namespace", "set", "--stream", stream, "--group", "g", "--namespace", "prod", "--reason", reason, "--by", "oncall"},
	} {
		args = append(args, "--database-url", url, "--db-schema", schema)
		if code, out, errs := call(ctx, args...); code != 0 {
			t.Fatalf("%v: exit %d %s %s", args, code, out, errs)
		}
	}
	l, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EnsurePartitions(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	ts := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	ev := event.MeterEvent{EventName: "api", StripeCustomerID: "cus_1", Value: 6, Timestamp: ts, EventID: "r1"}
	cl, err := l.Reserve(ctx, []meterledger.Request{{Event: ev, Identifier: "r1", Owner: "t", Lease: time.Minute}})
	if err != nil || !cl[0].Decision.MaySend() {
		t.Fatalf("reserve: %v %+v", err, cl)
	}
	if _, err := l.Finish(ctx, []meterledger.Outcome{{Hold: cl[0].Hold(), Result: meterledger.Park, Reason: "lost"}}); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := call(ctx, "meter-settle", "--database-url", url, "--db-schema", schema, "--identifier", "r1",
		"--event-ts", ts.Format(time.RFC3339Nano), "--not-counted", "--reason", reason); code != 0 {
		t.Fatalf("meter-settle: exit %d %s %s", code, out, errs)
	}
	var recorded []string
	for _, q := range []string{"SELECT reason FROM %s.stream_pauses", "SELECT reason FROM %s.stream_fact_changes", "SELECT last_error FROM %s.meter_events"} {
		rows, err := pool.Query(ctx, fmt.Sprintf(q, pgx.Identifier{schema}.Sanitize()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(got) == 0 {
			t.Fatalf("%s: %v %v", q, got, err)
		}
		recorded = append(recorded, got...)
	}
	if len(recorded) != 4 {
		t.Fatalf("%d reasons recorded, want 4 (a pause, its change, a namespace change, a settlement): %q", len(recorded), recorded)
	}
	for _, r := range recorded {
		if strings.Contains(r, "sk_live_") || strings.Contains(r, card) || strings.Contains(r, "4242424242424242") || !strings.Contains(r, "customer said card") {
			t.Errorf("recorded %q: want the reason with the key and the card number redacted", r)
		}
	}
}
