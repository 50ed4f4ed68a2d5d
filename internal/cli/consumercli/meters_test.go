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
