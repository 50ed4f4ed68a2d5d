package naive

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// MonitorConfig configures the seed's "stuck message" monitor.
type MonitorConfig struct {
	Redis  redis.UniversalClient
	Stream string
	Group  string
	// Consumer is the name the claimed entries are transferred to
	// ("consumer-B" in the seed).
	Consumer string
	// MinIdle is XAUTOCLAIM's min-idle-time (60 s in the seed). It cannot
	// tell a dead consumer from a slow one: that is failure mode 1.
	MinIdle time.Duration
	// Count is XAUTOCLAIM's COUNT per call. Default 100.
	Count int64
	// Handler receives each page of claimed messages, normally a naive
	// Consumer's ProcessClaimed, which charges them again.
	Handler func(ctx context.Context, msgs []redis.XMessage) error
	// Logger; discarded when nil.
	Logger *slog.Logger
}

// Monitor reclaims every entry idle longer than MinIdle, with no look at any
// ledger: the behaviour pelguard's reaper replaces.
type Monitor struct {
	cfg MonitorConfig
	log *slog.Logger
}

// NewMonitor validates cfg and returns a Monitor.
func NewMonitor(cfg MonitorConfig) (*Monitor, error) {
	if cfg.Redis == nil || cfg.Handler == nil {
		return nil, errors.New("naive: monitor needs Redis and Handler")
	}
	if cfg.Stream == "" || cfg.Group == "" || cfg.Consumer == "" {
		return nil, errors.New("naive: monitor needs Stream, Group and Consumer")
	}
	if cfg.MinIdle < 0 {
		return nil, fmt.Errorf("naive: negative MinIdle %s", cfg.MinIdle)
	}
	cfg.Count = cmp.Or(cfg.Count, 100)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Monitor{cfg: cfg, log: log.With(slog.String("monitor", cfg.Consumer))}, nil
}

// RunOnce runs XAUTOCLAIM stream group consumer min-idle 0-0 COUNT n, follows
// the returned cursor until it comes back as 0-0, and hands each page of
// claimed messages to Handler. It returns how many entries it claimed.
func (m *Monitor) RunOnce(ctx context.Context) (claimed int, err error) {
	start := "0-0"
	for {
		msgs, next, err := m.cfg.Redis.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream:   m.cfg.Stream,
			Group:    m.cfg.Group,
			Consumer: m.cfg.Consumer,
			MinIdle:  m.cfg.MinIdle,
			Start:    start,
			Count:    m.cfg.Count,
		}).Result()
		if err != nil {
			return claimed, fmt.Errorf("naive: XAUTOCLAIM %s %s from %s: %w", m.cfg.Stream, m.cfg.Group, start, err)
		}
		if len(msgs) > 0 {
			claimed += len(msgs)
			m.log.InfoContext(ctx, "reclaimed stuck messages", slog.Int("count", len(msgs)))
			if err := m.cfg.Handler(ctx, msgs); err != nil {
				return claimed, fmt.Errorf("naive: handling %d reclaimed entries: %w", len(msgs), err)
			}
		}
		if next == "0-0" || next == "" {
			return claimed, nil
		}
		start = next
	}
}

// Run calls RunOnce every interval until ctx ends, logging failures.
func (m *Monitor) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("naive: monitor interval must be positive, got %s", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := m.RunOnce(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			m.log.WarnContext(ctx, "naive monitor: pass failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
