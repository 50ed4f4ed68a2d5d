package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
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

// ForgetSilent removes name from the registry if its last heartbeat is
// still lastBeat (as Registered read it): a consumer that beat since is
// alive and stays. It reports whether the name was removed. The reaper's
// hygiene calls it for names gone from the group and silent for its
// consumer-idle time; every process has a unique name, so the registry
// otherwise grows with every restart.
func ForgetSilent(ctx context.Context, rdb redis.UniversalClient, stream, group, name string, lastBeat time.Time) (bool, error) {
	n, err := forgetSilentScript.Run(ctx, rdb, []string{LivenessKey(stream, group)}, name, lastBeat.UnixMilli()).Int64()
	if err != nil {
		return false, fmt.Errorf("forgetting consumer %s on %s/%s: %w", name, stream, group, err)
	}
	return n == 1, nil
}

// forgetSilentScript deletes a registry field only if it still holds the
// heartbeat read (one key: any Redis Cluster slot).
var forgetSilentScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0`)

// Forget removes names from the registry (the reaper's hygiene, once a
// consumer has left the group).
func Forget(ctx context.Context, rdb redis.UniversalClient, stream, group string, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	return rdb.HDel(ctx, LivenessKey(stream, group), names...).Err()
}

// Stats is what a consumer publishes with each heartbeat beside its
// liveness, for the console's live pipeline: how many stream entries it
// has handled since it started and at what rate since its previous beat.
// Each consumer's stats are one key that expires (StatsTTL), so dead
// consumers' stats do not pile up.
type Stats struct {
	Events    int64     `json:"events"`
	PerSecond float64   `json:"per_s"`
	At        time.Time `json:"at"`
}

// StatsTTL is how long a consumer's published stats outlive its last
// heartbeat.
const StatsTTL = 10 * time.Minute

// StatsKey is the key of one consumer's published Stats.
func StatsKey(stream, group, name string) string {
	return stream + ":pelguard:consumer-stats:" + group + ":" + name
}

// registerWithStats is Register and the consumer's Stats in one round trip.
func registerWithStats(ctx context.Context, rdb redis.UniversalClient, stream, group, name string, now time.Time, st Stats) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	pipe := rdb.Pipeline()
	pipe.HSet(ctx, LivenessKey(stream, group), name, now.UnixMilli())
	pipe.Set(ctx, StatsKey(stream, group, name), b, StatsTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("registering consumer %s on %s/%s: %w", name, stream, group, err)
	}
	return nil
}

// ReadStats reads the published Stats of names (one pipelined GET each,
// so it works across Redis Cluster slots); a consumer without stats (never
// published, or expired) is absent from the result.
func ReadStats(ctx context.Context, rdb redis.UniversalClient, stream, group string, names []string) (map[string]Stats, error) {
	out := map[string]Stats{}
	if len(names) == 0 {
		return out, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(names))
	for i, n := range names {
		cmds[i] = pipe.Get(ctx, StatsKey(stream, group, n))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reading consumer stats on %s/%s: %w", stream, group, err)
	}
	for i, c := range cmds {
		var st Stats
		if b, err := c.Bytes(); err == nil && json.Unmarshal(b, &st) == nil {
			out[names[i]] = st
		}
	}
	return out, nil
}

// statCounter counts the stream entries a consumer handled (any outcome)
// and computes its Stats at each beat: the count, and the rate since the
// previous beat. Billing consumers (heartbeat) and meter consumers
// (MeterConsumer.beat) publish the same.
type statCounter struct {
	events    atomic.Int64
	statsMu   sync.Mutex
	statsLast Stats
}

// stats is the Stats at now: the count, and the rate since the previous
// call.
func (sc *statCounter) stats(now time.Time) Stats {
	n := sc.events.Load()
	sc.statsMu.Lock()
	defer sc.statsMu.Unlock()
	st := Stats{Events: n, At: now}
	if last := sc.statsLast; !last.At.IsZero() {
		if dt := now.Sub(last.At).Seconds(); dt > 0 {
			st.PerSecond = float64(n-last.Events) / dt
		} else {
			st.PerSecond = last.PerSecond
		}
	}
	sc.statsLast = st
	return st
}
