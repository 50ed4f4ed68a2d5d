// Command embed is a team's own Go service running pelguard's consumer,
// reaper and auditor in-process, built from exported identifiers only: its
// own Redis client, its own Postgres pool and a Stripe key. It is a module of
// its own (with a replace to the repository), so the Go toolchain proves that
// nothing under pelguard's internal/ is needed; `make test` runs its test
// against real Redis and Postgres and the repository's Stripe emulator.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

// Options is what the service brings to pelguard.
type Options struct {
	Redis  redis.UniversalClient
	DB     *pgxpool.Pool
	Schema string // Postgres schema of pelguard's tables ("" is "pelguard")

	StripeKey  string // sk_test_, or a restricted rk_ key
	StripeBase string // "" is Stripe itself; tests point it at an emulator

	Stream, Group string
	Namespace     string // part of the idempotency key: one per environment
	Logger        *slog.Logger
}

// Billing is pelguard embedded: a consumer, a reaper and a scheduled auditor.
type Billing struct {
	Consumer *consumer.Consumer
	Reaper   *reaper.Reaper
	Auditor  *audit.Auditor
	audits   *audit.Scheduler
}

// NewBilling builds the three from the service's own clients.
func NewBilling(o Options) (*Billing, error) {
	stripeCfg := stripeapi.Config{APIKey: o.StripeKey, BaseURL: o.StripeBase, Logger: o.Logger}
	// One adapter for the consumer and the reaper, so they share its rate limit.
	stripe, err := stripeapi.New(stripeCfg)
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(consumer.Config{
		Redis: o.Redis, DB: o.DB, Schema: o.Schema, Stripe: stripe,
		Stream: o.Stream, Group: o.Group, Namespace: o.Namespace, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	r, err := reaper.New(reaper.Config{
		Redis: o.Redis, DB: o.DB, Schema: o.Schema, Stripe: stripe,
		Streams:   []reaper.StreamGroup{{Stream: o.Stream, Group: o.Group}},
		Namespace: o.Namespace, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	a, err := audit.New(audit.Config{DB: o.DB, Schema: o.Schema, Stripe: stripeCfg, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	s, err := a.NewScheduler("*/15 * * * *", nil)
	if err != nil {
		return nil, err
	}
	return &Billing{Consumer: c, Reaper: r, Auditor: a, audits: s}, nil
}

// Start starts the consumer, the reaper and the audit schedule.
func (b *Billing) Start(ctx context.Context) error {
	if err := b.Consumer.Start(ctx); err != nil {
		return fmt.Errorf("starting the consumer: %w", err)
	}
	if err := b.Reaper.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("starting the reaper: %w", err), b.Stop(ctx))
	}
	if err := b.audits.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("starting the audit schedule: %w", err), b.Stop(ctx))
	}
	return nil
}

// Stop stops all three, letting Stripe calls in flight finish until ctx
// ends. Stopping twice, or what never started, is safe.
func (b *Billing) Stop(ctx context.Context) error {
	return errors.Join(b.Consumer.Stop(ctx), b.Reaper.Stop(ctx), b.audits.Stop(ctx))
}
