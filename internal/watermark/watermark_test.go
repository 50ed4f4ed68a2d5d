package watermark_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/internal/watermark"
)

// The watermark is held back by an unread entry (at its millisecond), then
// by a pending one (read, not acked), and is the server's TIME once the
// group has read and acked everything.
func TestWatermarkPendingUnreadAndAllRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "watermark")
	testenv.CleanupKeys(t, rdb, stream)
	const group = "g"
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "$").Err(); err != nil {
		t.Fatal(err)
	}
	// Explicit ids far below the server's clock: whatever holds the mark
	// is visible in it.
	for _, id := range []string{"1000-0", "2500-0", "2500-1", "4200-0"} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: map[string]any{"k": id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read := func() watermark.Mark {
		t.Helper()
		m, err := watermark.Read(ctx, rdb, stream, group)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := read(); m.MS != 0 || !m.Unread || m.Pending {
		t.Fatalf("nothing read: %+v, want 0 (the group's last delivered id is 0-0), unread", m)
	}
	readN := func(n int64) []redis.XMessage {
		t.Helper()
		s, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{stream, ">"}, Count: n}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return s[0].Messages
	}
	// Read 1000-0 and 2500-0 and ack both: 2500-1 is unread in 2500's
	// millisecond, so the mark is 2500 (second 1 has passed, second 2 not).
	msgs := readN(2)
	if err := rdb.XAck(ctx, stream, group, msgs[0].ID, msgs[1].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if m := read(); m.MS != 2500 || !m.Unread || m.Pending || !m.Passed(1) || m.Passed(2) {
		t.Fatalf("unread below: %+v, want 2500, unread", m)
	}
	// Read the rest; 2500-1 stays pending: the mark is its millisecond.
	msgs = readN(10)
	if err := rdb.XAck(ctx, stream, group, msgs[1].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if m := read(); m.MS != 2500 || m.Unread || !m.Pending {
		t.Fatalf("pending below: %+v, want 2500, pending", m)
	}
	// All read and acked: the server's TIME.
	if err := rdb.XAck(ctx, stream, group, msgs[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Minute)
	if m := read(); m.Pending || m.Unread || m.Time().Before(before) || m.Time().After(time.Now().Add(time.Minute)) {
		t.Fatalf("all read: %+v (%s), want the server's time", m, m.Time())
	}
	// A group reset to 0 (XGROUP SETID 0): everything unread again.
	if err := rdb.XGroupSetID(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if m := read(); m.MS != 0 || !m.Unread {
		t.Fatalf("after XGROUP SETID 0: %+v, want 0", m)
	}
	if got, err := watermark.ArrivalSecond("4200-7"); err != nil || got != 4 {
		t.Fatalf("ArrivalSecond(4200-7) = %d, %v", got, err)
	}
	if _, err := watermark.Read(ctx, rdb, stream, "nogroup"); err == nil {
		t.Fatal("a missing group: want an error")
	}
}
