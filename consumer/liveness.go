package consumer

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Liveness: every pelguard consumer (and every reaper re-drive) registers
// its name in a Redis hash per stream and group, with the time of its last
// heartbeat. The reaper re-drives an entry of a registered consumer whose
// heartbeat has stopped, and leaves alone the entries of group members that
// never registered: a team's own consumer, still running the old code, has
// no heartbeat, so its slow Stripe call and its death look the same in the
// PEL ("reclaim while in flight").

// LivenessKey is the hash that holds the group's registered consumers:
// field = consumer name, value = Unix milliseconds of its last heartbeat.
func LivenessKey(stream, group string) string {
	return stream + ":pelguard:consumers:" + group
}

// Register records that name is alive now. Consumers and re-drives call it
// on every heartbeat; tests call it to stand in for a pelguard consumer.
func Register(ctx context.Context, rdb redis.UniversalClient, stream, group, name string, now time.Time) error {
	if err := rdb.HSet(ctx, LivenessKey(stream, group), name, now.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("registering consumer %s on %s/%s: %w", name, stream, group, err)
	}
	return nil
}

// Registered reads the group's registered consumers and their last
// heartbeats.
func Registered(ctx context.Context, rdb redis.UniversalClient, stream, group string) (map[string]time.Time, error) {
	m, err := rdb.HGetAll(ctx, LivenessKey(stream, group)).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the consumers registered on %s/%s: %w", stream, group, err)
	}
	out := make(map[string]time.Time, len(m))
	for name, v := range m {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue // not ours to judge; treated as unregistered
		}
		out[name] = time.UnixMilli(ms)
	}
	return out, nil
}

// Forget removes names from the registry (the reaper's hygiene, once a
// consumer has left the group).
func Forget(ctx context.Context, rdb redis.UniversalClient, stream, group string, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	return rdb.HDel(ctx, LivenessKey(stream, group), names...).Err()
}
