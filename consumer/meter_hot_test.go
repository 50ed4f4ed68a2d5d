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

// The bucket after a busy customer's last one is ready once the watermark,
// aligned down to the width, has passed its end: not a millisecond before.
func TestBucketAfterEndedByTheWatermark(t *testing.T) {
	t.Parallel()
	s := time.Unix(1_800_000_000, 0).UTC() // aligned to a minute
	for _, tc := range []struct {
		width time.Duration
		mark  time.Duration // after s
		want  bool
	}{
		{time.Second, 1999 * time.Millisecond, false},
		{time.Second, 2 * time.Second, true},
		{time.Second, 90 * time.Second, true},
		{0, 2 * time.Second, true}, // the default width: a second
		{time.Minute, 119 * time.Second, false},
		{time.Minute, 120 * time.Second, true},
	} {
		if got := bucketAfterEnded(s, tc.width, s.Add(tc.mark)); got != tc.want {
			t.Errorf("width %s, watermark %s after the bucket's start: ended %v, want %v", tc.width, tc.mark, got, tc.want)
		}
	}
}
