package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/naive"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/stripeapi"
)

// ChildEnv names the environment variable that turns the drill's own
// binary into the child of partial-batch: a consumer that SIGKILLs itself
// right after Stripe's reply, before the outcome is recorded or acked.
const ChildEnv = "PELGUARD_CHAOS_CHILD"

// Child settings, passed by the environment so no secret shows in ps.
const (
	envRedis  = "PELGUARD_CHAOS_REDIS_URL"
	envDB     = "PELGUARD_CHAOS_DATABASE_URL"
	envSchema = "PELGUARD_CHAOS_DB_SCHEMA"
	envStripe = "PELGUARD_CHAOS_STRIPE_URL"
	envStream = "PELGUARD_CHAOS_STREAM"
	envGroup  = "PELGUARD_CHAOS_GROUP"
	envLease  = "PELGUARD_CHAOS_LEASE"
)

// RunChildIfRequested runs the killed child when ChildEnv is set and
// reports its exit code; ok is false in a normal run. cmd/chaos's main and
// the tests' TestMain call it before anything else.
func RunChildIfRequested() (code int, ok bool) {
	mode := os.Getenv(ChildEnv)
	if mode == "" {
		return 0, false
	}
	if err := runChild(mode); err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 3, true
	}
	// Reached only if the hook never fired (nothing to read).
	fmt.Fprintln(os.Stderr, "chaos child: no charge was made, so nothing killed the process")
	return 4, true
}

func killSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// killAfterCharge is the pelguard child's Stripe: the process dies as
// Stripe's first successful charge reply arrives, before the consumer
// records or acks anything. consumer.TestConfig.AfterStripeReply fires
// after any reply, an error too: on a loaded machine a call that failed
// (its lease lost, a timeout) killed the child with nothing charged, and
// partial-batch/pelguard failed with "the child died before any charge".
type killAfterCharge struct{ *stripeapi.Client }

func (k killAfterCharge) Charge(ctx context.Context, req stripeapi.ChargeRequest) (stripeapi.Charge, error) {
	ch, err := k.Client.Charge(ctx, req)
	if err == nil {
		killSelf()
	}
	return ch, err
}

func runChild(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb, err := cli.OpenRedis(ctx, os.Getenv(envRedis))
	if err != nil {
		return err
	}
	defer rdb.Close()
	stream, group := os.Getenv(envStream), os.Getenv(envGroup)
	switch mode {
	case ModeNaive:
		sc, err := stripeapi.New(stripeapi.Config{APIKey: stripeKey, BaseURL: os.Getenv(envStripe), Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1})
		if err != nil {
			return err
		}
		// The seed's batch consumer; the Record hook is the moment after
		// the charge and before XACK, where the process dies.
		c, err := naive.NewConsumer(naive.ConsumerConfig{
			Redis: rdb, Stream: stream, Group: group, Name: "child", Count: 10, Block: 50 * time.Millisecond,
			Stripe: sc, DeferAck: true,
			Record: func(context.Context, string, naive.Event, stripeapi.Charge) error { killSelf(); return nil },
		})
		if err != nil {
			return err
		}
		_, err = c.RunOnce(ctx)
		return err
	case ModePelguard:
		pool, err := pg.Open(ctx, os.Getenv(envDB), 4)
		if err != nil {
			return err
		}
		defer pool.Close()
		sc, err := stripeapi.New(stripeapi.Config{APIKey: stripeKey, BaseURL: os.Getenv(envStripe), MaxNetworkRetries: -1})
		if err != nil {
			return err
		}
		l, err := time.ParseDuration(os.Getenv(envLease))
		if err != nil {
			return fmt.Errorf("parsing the lease: %w", err)
		}
		c, err := consumer.New(consumer.Config{
			Redis: rdb, DB: pool, Schema: os.Getenv(envSchema), Stripe: killAfterCharge{sc}, Stream: stream, Group: group,
			Name: "child", Namespace: namespace, Count: 10, Workers: 4, Lease: l, Block: 50 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		select {
		case <-c.Done():
		case <-ctx.Done():
		}
		return nil
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

// runKilledChild re-runs the drill's binary as a consumer that reads one
// COUNT 10 batch and is SIGKILLed between Stripe's first reply and XACK,
// and checks that it died that way with the charge made.
func (c *cell) runKilledChild(ctx context.Context) error {
	exe, err := executable(c.d.cfg)
	if err != nil {
		return err
	}
	c.d.progress.update(c, "a consumer process is SIGKILLed between Stripe reply and XACK")
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe)
	cmd.Env = append(os.Environ(), ChildEnv+"="+c.mode, envRedis+"="+c.redisURL, envDB+"="+c.dbURL, envSchema+"="+c.schema,
		envStripe+"="+c.sim.URL(), envStream+"="+c.stream, envGroup+"="+c.group,
		envLease+"="+lease(c.d.cfg.MinIdle).String())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("the child consumer should have died of SIGKILL, it ended with %v: %s", err, strings.TrimSpace(string(out)))
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("the child consumer should have died of SIGKILL, it ended with %v: %s", err, strings.TrimSpace(string(out)))
	}
	if c.billable() == 0 {
		return errors.New("the child died before any charge: the drill did not reproduce the kill after the Stripe reply")
	}
	return nil
}
