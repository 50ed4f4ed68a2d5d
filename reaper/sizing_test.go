package reaper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// bytesPerEntryBudget is the figure docs/operations/bounded.md sizes Redis
// with: MEMORY USAGE of a stream of realistic events, per entry, must stay
// under it, or the sizing rule there is wrong.
const bytesPerEntryBudget = 250

// TestStreamBytesPerEntry measures what an entry costs Redis: 20,000
// billing events and 20,000 meter events (realistic ids and values, one
// "payload" field, ids from XADD *), MEMORY USAGE … SAMPLES 0 of each
// stream divided by its length, and the growth of used_memory.
func TestStreamBytesPerEntry(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	const n = 20_000
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, kind := range []string{"billing", "meter"} {
		stream := testenv.Name(t, kind)
		testenv.CleanupKeys(t, rdb, stream)
		usedBefore := usedMemory(t, rdb)
		pipe := rdb.Pipeline()
		for i := range n {
			var payload string
			if kind == "billing" {
				payload = event.Event{CustomerID: fmt.Sprintf("cust_%06d", i%5000), StripeCustomerID: fmt.Sprintf("cus_Q%013d", i%5000),
					AmountCents: 1000 + int64(i%9000), BillingPeriod: "2026-12", Currency: "usd"}.Payload()
			} else {
				payload = event.MeterEvent{EventName: "api_requests", CustomerID: fmt.Sprintf("cust_%06d", i%5000),
					StripeCustomerID: fmt.Sprintf("cus_Q%013d", i%5000), Value: int64(1 + i%50),
					Timestamp: at.Add(time.Duration(i) * time.Millisecond), EventID: fmt.Sprintf("evt_%010d", i)}.Payload()
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": payload}})
			if i%1000 == 999 {
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		usage, err := rdb.MemoryUsage(ctx, stream, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		used := usedMemory(t, rdb) - usedBefore
		per := float64(usage) / n
		t.Logf("%s stream: %d entries, MEMORY USAGE %d bytes = %.0f bytes/entry; used_memory grew %d bytes = %.0f bytes/entry (other tests' keys included)",
			kind, n, usage, per, used, float64(used)/n)
		if per > bytesPerEntryBudget {
			t.Errorf("%s entries cost %.0f bytes each, above the %d the sizing rule in docs/operations/bounded.md uses: update it", kind, per, bytesPerEntryBudget)
		}
	}
}
