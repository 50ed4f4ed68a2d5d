package reaper

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed delconsumer.lua
var delConsumerLua string

var delConsumerScript = redis.NewScript(delConsumerLua)

//go:embed uncount.lua
var uncountLua string

var uncountScript = redis.NewScript(uncountLua)

// hygiene removes consumers idle longer than ConsumerIdle that have nothing
// pending. Dead consumers' names otherwise pile up in the group (every
// process has a unique name). The reaper's own name is never removed: it may
// be between a claim and a re-drive.
func (r *Reaper) hygiene(ctx context.Context, st *streamState, p *pass) error {
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
	for _, c := range cs {
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
		}
		r.record(p, d)
	}
	return nil
}
