package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/redisurl"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	// Any URL the binaries take: redis://, redis+cluster://, redis+sentinel://.
	rdb, err := redisurl.Open(cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"))
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		return err
	}
	defer pool.Close()

	schema := cmp.Or(os.Getenv("PELGUARD_DB_SCHEMA"), migrations.DefaultSchema)
	m, err := migrations.New(pool, schema, logger)
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		return err
	}

	b, err := NewBilling(Options{
		Redis: rdb, DB: pool, Schema: schema,
		StripeKey: os.Getenv("STRIPE_API_KEY"), StripeBase: os.Getenv("STRIPE_API_BASE"),
		Stream: "billing-stream", Group: "billing-group", Namespace: cmp.Or(os.Getenv("PELGUARD_NAMESPACE"), "dev"),
		Logger: logger,
	})
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.Stop(stopCtx)
}
