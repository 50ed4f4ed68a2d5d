package consumercli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// `pelguard-consumer meter-events`: refuses a --safe-window Stripe does not
// guard, then sends a stream's meter events, each counted once at the
// emulator, and stops cleanly on cancellation.
func TestMeterEventsCommand(t *testing.T) {
	if code, _, errs := call(context.Background(), "meter-events", "--safe-window", "25h"); code != 2 || !strings.Contains(errs, "below Stripe's 24h") {
		t.Fatalf("--safe-window 25h: exit %d %s", code, errs)
	}
	if code, _, errs := call(context.Background(), "meter-events", "--pipeline", "0"); code != 2 || !strings.Contains(errs, "--pipeline 0") {
		t.Fatalf("--pipeline 0: exit %d %s", code, errs)
	}
	for _, c := range []struct{ args, want []string }{
		{[]string{"--send-slots", "64"}, []string{"--send-slots 64 applies to --send-from-ledger only", "add --send-from-ledger"}},
		{[]string{"--send-from-ledger", "--send-slots", "-1"}, []string{"--send-slots -1 must be between 0 (4 × --workers) and 1024"}},
	} {
		code, _, errs := call(context.Background(), append([]string{"meter-events"}, c.args...)...)
		for _, w := range c.want {
			if code != 2 || !strings.Contains(errs, w) {
				t.Fatalf("%v: exit %d, %q; want exit 2 naming %q", c.args, code, errs, w)
			}
		}
	}
	_, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	sim, err := stripesim.New(stripesim.Config{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_requests"}); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "usage")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	now := time.Now().UTC()
	want := map[string]int64{}
	for i := range 30 {
		e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_%d", i%3), Value: int64(i + 1),
			Timestamp: now.Add(-time.Duration(i) * time.Second), EventID: fmt.Sprintf("e%d", i)}
		want[e.StripeCustomerID] += e.Value
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// One invalid event: a value that is not a whole number.
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": `{"event_name":"api_requests","stripe_customer_id":"cus_0","value":1.5,"timestamp":"` + now.Format(time.RFC3339) + `"}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("STRIPE_API_KEY", "sk_test_meter_command")
	t.Setenv("STRIPE_API_BASE", sim.URL())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb testenv.SyncBuffer
	go func() {
		done <- Main(ctx, []string{"meter-events", "--redis-url", testenv.RedisURL(), "--database-url", url, "--db-schema", schema,
			"--stream", stream, "--group", "meters", "--metrics-addr", "", "--wait-for-deps", "10s", "--block", "50ms"}, &testenv.SyncBuffer{}, &errb)
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, _ := rdb.XLen(context.Background(), stream+":dead").Result()
		return sim.MeterEventCounts().Recorded == 30 && n == 1
	}, "meter events not all sent (%+v): %s", sim.MeterEventCounts(), &errb)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for cus, v := range want {
		if got := sim.MeterTotal("api_requests", cus); got != v {
			t.Errorf("%s: Stripe counts %d, want %d", cus, got, v)
		}
	}
}

// `pelguard-consumer meter-events --aggregate-meters`: refused without
// --send-from-ledger and for a meter that is not a sum meter, each with
// the fix; with a sum meter, a customer's events of one second go out as
// one call carrying their sum: Stripe's totals exact, in fewer calls than
// events.
func TestMeterEventsCommandAggregates(t *testing.T) {
	if code, _, errs := call(context.Background(), "meter-events", "--aggregate-meters", "api_requests"); code != 2 ||
		!strings.Contains(errs, "--aggregate-meters needs --send-from-ledger") {
		t.Fatalf("--aggregate-meters alone: exit %d %s", code, errs)
	}
	_, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	sim, err := stripesim.New(stripesim.Config{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	for _, m := range []stripesim.BillingMeterSeed{{EventName: "api_requests"}, {EventName: "logins", Formula: stripesim.FormulaCount}} {
		if _, err := sim.CreateBillingMeter(m); err != nil {
			t.Fatal(err)
		}
	}
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "usage")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	t.Setenv("STRIPE_API_KEY", "sk_test_meter_command")
	t.Setenv("STRIPE_API_BASE", sim.URL())
	args := func(extra ...string) []string {
		return append([]string{"meter-events", "--redis-url", testenv.RedisURL(), "--database-url", url, "--db-schema", schema,
			"--stream", stream, "--group", "meters", "--metrics-addr", "", "--wait-for-deps", "10s", "--block", "50ms", "--send-from-ledger"}, extra...)
	}
	var refused testenv.SyncBuffer
	if code := Main(context.Background(), args("--aggregate-meters", "api_requests,logins"), &testenv.SyncBuffer{}, &refused); code != 2 ||
		!strings.Contains(refused.String(), "not sum") || !strings.Contains(refused.String(), "remove logins from --aggregate-meters") {
		t.Fatalf("a count meter: exit %d %s", code, refused.String())
	}
	now := time.Now().UTC().Truncate(time.Second).Add(-time.Minute)
	want := map[string]int64{}
	for i := range 60 {
		e := event.MeterEvent{EventName: "api_requests", StripeCustomerID: fmt.Sprintf("cus_%d", i%3), Value: int64(i + 1),
			Timestamp: now.Add(time.Duration(i%2) * time.Second), EventID: fmt.Sprintf("e%d", i)}
		want[e.StripeCustomerID] += e.Value
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": e.Payload()}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb testenv.SyncBuffer
	go func() { done <- Main(ctx, args("--aggregate-meters", "api_requests"), &testenv.SyncBuffer{}, &errb) }()
	testenv.Eventually(t, 60*time.Second, func() bool {
		for cus, v := range want {
			if sim.MeterTotal("api_requests", cus) != v {
				return false
			}
		}
		return true
	}, "meter events not all counted (%+v): %s", sim.MeterEventCounts(), &errb)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// 3 customers × 2 seconds, each split at most once more by the
	// entries' arrival seconds.
	if got := sim.MeterEventCounts().Recorded; got > 12 {
		t.Fatalf("Stripe recorded %d calls for 60 events of 6 (customer, second) tuples: want at most 12", got)
	}
}

// Only sum meters of the account may be aggregated.
func TestCheckAggregateMeters(t *testing.T) {
	t.Parallel()
	meters := []stripeapi.Meter{{ID: "mtr_1", EventName: "tokens", Formula: stripeapi.MeterFormulaSum},
		{ID: "mtr_2", EventName: "seats", Formula: stripeapi.MeterFormulaLast}}
	for _, c := range []struct {
		names []string
		want  string
	}{
		{[]string{"tokens"}, ""},
		{[]string{"tokens", "seats"}, "aggregates by last, not sum"},
		{[]string{"calls"}, "no billing meter with event name calls"},
	} {
		err := checkAggregateMeters(c.names, meters)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v, want %q", c.names, err, c.want)
		}
	}
}

// `--aggregate-bucket`: a width that does not divide an hour is refused at
// start with the widths allowed, and so is a bucket without aggregated
// meters, each with the fix.
func TestMeterEventsCommandChecksTheAggregateBucket(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--send-from-ledger", "--aggregate-meters", "api_requests", "--aggregate-bucket", "7s"},
			[]string{"--aggregate-bucket 7s", "divides an hour evenly", "--aggregate-bucket 1m to catch up a backlog"}},
		{[]string{"--send-from-ledger", "--aggregate-meters", "api_requests", "--aggregate-bucket", "1500ms"},
			[]string{"--aggregate-bucket 1.5s", "whole number of seconds"}},
		{[]string{"--send-from-ledger", "--aggregate-meters", "api_requests", "--aggregate-bucket", "2h"},
			[]string{"--aggregate-bucket 2h0m0s", "divides an hour evenly"}},
		{[]string{"--send-from-ledger", "--aggregate-bucket", "1m"},
			[]string{"--aggregate-bucket 1m0s applies to aggregated meters only", "add --aggregate-meters"}},
	} {
		code, _, errs := call(context.Background(), append([]string{"meter-events"}, c.args...)...)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2: %s", c.args, code, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(errs, w) {
				t.Fatalf("%v: %q does not say %q", c.args, errs, w)
			}
		}
	}
}
