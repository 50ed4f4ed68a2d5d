package reaper

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
)

//go:embed delconsumer.lua
var delConsumerLua string

var delConsumerScript = redis.NewScript(delConsumerLua)

//go:embed uncount.lua
var uncountLua string

var uncountScript = redis.NewScript(uncountLua)

// hygiene keeps a stream and its group bounded: it removes idle consumers
// (removeIdle) and then bounds the stream itself (bound, trim.go: lost
// entries, the safe trim, the dead letters).
func (r *Reaper) hygiene(ctx context.Context, st *streamState, p *pass) error {
	return errors.Join(r.removeIdle(ctx, st, p), r.bound(ctx, st))
}

// removeIdle removes consumers idle longer than ConsumerIdle that have nothing
// pending. Dead consumers' names otherwise pile up in the group (every
// process has a unique name). The reaper's own name is never removed: it may
// be between a claim and a re-drive. Then it forgets, in the liveness
// registry, the names that are no longer group members and have not beaten
// for ConsumerIdle (forgetRegistered).
func (r *Reaper) removeIdle(ctx context.Context, st *streamState, p *pass) error {
	if r.cfg.ConsumerIdle < 0 {
		return nil
	}
	cs, err := r.cfg.Redis.XInfoConsumers(ctx, st.Stream, st.Group).Result()
	if redis.HasErrorPrefix(err, "NOGROUP") || redis.HasErrorPrefix(err, "no such key") {
		return nil // reported by reapStream already
	}
	if err != nil {
		return fmt.Errorf("XINFO CONSUMERS: %w", err)
	}
	members := make(map[string]bool, len(cs))
	for _, c := range cs {
		members[c.Name] = true
		if c.Name == r.cfg.Name || c.Pending > 0 || c.Idle < r.cfg.ConsumerIdle {
			continue
		}
		d := Decision{Time: r.cfg.Clock.Now(), Stream: st.Stream, Group: st.Group, Consumer: c.Name,
			Idle: c.Idle, Kind: KindRemoveConsumer, DryRun: r.cfg.DryRun,
			Reason: "idle " + c.Idle.Round(time.Second).String() + " with nothing pending"}
		if !r.cfg.DryRun {
			n, err := delConsumerScript.Run(ctx, r.cfg.Redis, []string{st.Stream}, st.Group, c.Name).Int64()
			if err != nil {
				return fmt.Errorf("removing consumer %s: %w", c.Name, err)
			}
			if n < 0 {
				continue // it read something since XINFO: alive after all
			}
			delete(members, c.Name)
		}
		r.record(p, d)
	}
	if r.cfg.DryRun {
		return nil
	}
	return r.forgetRegistered(ctx, st, members)
}

// forgetRegistered removes from the liveness registry the names that are
// not group members (never were, or removed above: members is the group
// as hygiene left it) and whose last heartbeat is older than ConsumerIdle.
// A name with pending entries is a member, so none is forgotten while it
// holds something; one that beats again between the read and the removal
// stays (ForgetSilent compares). A consumer that joined the group since
// XINFO has beaten within ConsumerIdle, or it would not be reading.
func (r *Reaper) forgetRegistered(ctx context.Context, st *streamState, members map[string]bool) error {
	reg, err := consumer.Registered(ctx, r.cfg.Redis, st.Stream, st.Group)
	if err != nil {
		return err
	}
	now := r.cfg.Clock.Now()
	forgotten := 0
	for name, beat := range reg {
		if members[name] || name == r.cfg.Name || now.Sub(beat) < r.cfg.ConsumerIdle {
			continue
		}
		ok, err := consumer.ForgetSilent(ctx, r.cfg.Redis, st.Stream, st.Group, name, beat)
		if err != nil {
			return err
		}
		if ok {
			forgotten++
		}
	}
	if forgotten > 0 {
		r.cfg.Logger.InfoContext(ctx, "reaper: forgot consumers gone from the group and silent",
			"stream", st.Stream, "group", st.Group, "consumers", forgotten, "silent_for", r.cfg.ConsumerIdle.String())
	}
	return nil
}
