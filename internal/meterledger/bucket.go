package meterledger

import (
	"fmt"
	"time"
)

// DefaultBucket is an aggregate's width of event time: one second, the
// unit Stripe keeps a meter event's timestamp in, so an aggregate shows in
// Stripe's summaries and invoices exactly where its members would have.
const DefaultBucket = time.Second

// Buckets are the widths an aggregate may span, listed for messages: every
// width that divides an hour evenly is allowed (CheckBucket).
const Buckets = "1s, 2s, 3s, 4s, 5s, 6s, 10s, 12s, 15s, 20s, 30s, 1m, 2m, 3m, 4m, 5m, 6m, 10m, 12m, 15m, 20m, 30m, 1h"

// CheckBucket reports whether width may be an aggregate's bucket: whole
// seconds that divide an hour evenly. Buckets are aligned to the width
// from the Unix epoch, so each lies inside one UTC hour — one window of
// the usage reconciliation (hours, then days), one calendar month of a
// spend cap — and moving a member's usage to its bucket's start never
// moves it into another window. It does move it across a subscription
// period boundary inside the bucket (a period can start at any second):
// the price of a coarser bucket.
func CheckBucket(width time.Duration) error {
	s := int64(width / time.Second)
	if width <= 0 || width%time.Second != 0 || 3600%s != 0 {
		return fmt.Errorf("aggregate bucket %s: want whole seconds that divide an hour evenly (%s), "+
			"so every bucket lies inside one UTC hour; 1s unless catching up a backlog", width, Buckets)
	}
	return nil
}

// bucketSeconds is width in seconds (0: DefaultBucket).
func bucketSeconds(width time.Duration) (int64, error) {
	if width == 0 {
		width = DefaultBucket
	}
	if err := CheckBucket(width); err != nil {
		return 0, fmt.Errorf("meter ledger: %w", err)
	}
	return int64(width / time.Second), nil
}

// BucketStart is the start of the bucket of width holding ts: its second
// aligned down to the width from the Unix epoch (the timestamp the
// aggregate is sent with).
func BucketStart(ts time.Time, width time.Duration) time.Time {
	w, err := bucketSeconds(width)
	if err != nil {
		w = 1
	}
	return time.Unix(alignDown(ts.Unix(), w), 0).UTC()
}

// alignDown is the multiple of w at or below s (floor, also for s < 0).
func alignDown(s, w int64) int64 {
	q := s / w
	if s%w != 0 && s < 0 {
		q--
	}
	return q * w
}
