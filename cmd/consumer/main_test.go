package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

const testKey = "sk_test_DoNotPrintMe0123456789"

// The binary consumes, and on SIGTERM finishes the Stripe call in flight and
// exits 0. Its output never carries the Stripe key it was given.
func TestBinarySIGTERM(t *testing.T) {
	t.Parallel()
	bin := build(t)
	_, dbURL := testenv.DBWithURL(t)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	sim := stripesim.MustNew(stripesim.Config{})
	defer sim.Close()
	_ = sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: 700 * time.Millisecond}})
	ev := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": ev.Payload()}}).Err(); err != nil {
		t.Fatal(err)
	}
	const secret = testKey
	cmd := exec.Command(bin, "--stream", stream, "--metrics-addr", "127.0.0.1:0", "--block", "100ms", "--log-level", "debug")
	cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(), "DATABASE_URL="+dbURL, "PELGUARD_DB_SCHEMA="+testenv.SchemaOfURL(dbURL),
		"STRIPE_API_KEY="+secret, "STRIPE_API_BASE="+sim.URL())
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the Stripe call is in flight, then ask it to stop.
	testenv.Eventually(t, 15*time.Second, func() bool {
		return sim.Requests()["POST /v1/payment_intents"] > 0
	}, "charge request in flight")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("did not exit after SIGTERM\n%s", logs.String())
	}
	if n := sim.SucceededCharges("c_1", "2026-11"); n != 1 {
		t.Fatalf("%d charges\n%s", n, logs.String())
	}
	p, _ := rdb.XPending(context.Background(), stream, "billing-group").Result()
	if p.Count != 0 {
		t.Fatalf("%d pending after a clean stop", p.Count)
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatal("the Stripe key appeared in the output")
	}
}

// One process consumes several streams (--stream repeated and
// comma-separated, one with its own group): every event on each is charged
// once, and SIGTERM leaves nothing pending on any of them.
func TestBinaryConsumesSeveralStreams(t *testing.T) {
	t.Parallel()
	bin := build(t)
	_, dbURL := testenv.DBWithURL(t)
	rdb := testenv.Redis(t)
	ctx := context.Background()
	streams := []string{testenv.Name(t, "a"), testenv.Name(t, "b"), testenv.Name(t, "c")}
	groups := []string{"billing-group", "billing-group", "other-group"}
	for _, s := range streams {
		testenv.CleanupKeys(t, rdb, s, s+":dead")
	}
	sim := stripesim.MustNew(stripesim.Config{})
	defer sim.Close()
	const perStream = 5
	for i, s := range streams {
		for j := range perStream {
			ev := event.Event{CustomerID: fmt.Sprintf("c_%d_%d", i, j), StripeCustomerID: "cus_1", AmountCents: 100,
				BillingPeriod: "2026-11", Currency: "usd"}
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"payload": ev.Payload()}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command(bin, "--stream", streams[0]+","+streams[1], "--stream", streams[2]+"="+groups[2],
		"--metrics-addr", "", "--block", "100ms", "--workers", "2")
	cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(), "DATABASE_URL="+dbURL, "PELGUARD_DB_SCHEMA="+testenv.SchemaOfURL(dbURL),
		"STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return sim.ChargeCreates() >= 3*perStream }, "%d charges", 3*perStream)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
	for i, s := range streams {
		for j := range perStream {
			if n := sim.SucceededCharges(fmt.Sprintf("c_%d_%d", i, j), "2026-11"); n != 1 {
				t.Errorf("%s event %d: %d charges, want 1", s, j, n)
			}
		}
		p, err := rdb.XPending(ctx, s, groups[i]).Result()
		if err != nil || p.Count != 0 {
			t.Errorf("%s/%s: %v pending (%v)", s, groups[i], p, err)
		}
	}
	if n := sim.ChargeCreates(); n != 3*perStream {
		t.Errorf("%d charge creates, want %d", n, 3*perStream)
	}
	if t.Failed() {
		t.Log(logs.String())
	}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// build compiles the consumer binary once per test run.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "consumer-bin"); buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "consumer"), ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "consumer")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
