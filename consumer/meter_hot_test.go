package consumer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// Hot customer-meters are listed the most recent first, at most hotMax of
// them, and forgotten hotFor after their last large aggregate.
func TestHotKeysAreRecentAndBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	key := func(i int) meterledger.MeterKey {
		return meterledger.MeterKey{EventName: "tokens", StripeCustomerID: fmt.Sprintf("cus_%03d", i)}
	}
	hot := map[meterledger.MeterKey]time.Time{}
	for i := range hotMax + 5 {
		hot[key(i)] = now.Add(-time.Duration(hotMax+5-i) * 100 * time.Millisecond) // key(hotMax+4) the most recent
	}
	hot[key(999)] = now.Add(-hotFor - time.Millisecond)
	got := hotKeys(hot, now)
	if len(got) != hotMax || got[0] != key(hotMax+4) || got[hotMax-1] != key(5) {
		t.Fatalf("hot keys: %d, first %v, last %v; want %d, the most recent (%v) first, %v last",
			len(got), got[0], got[len(got)-1], hotMax, key(hotMax+4), key(5))
	}
	if slices.Contains(got, key(4)) {
		t.Fatalf("%v listed past hotMax", key(4))
	}
	if _, ok := hot[key(999)]; ok {
		t.Fatalf("a key last hot %s ago is still kept", hotFor+time.Millisecond)
	}
}
