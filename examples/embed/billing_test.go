package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/migrations"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestBilling embeds pelguard the way a team's service would and bills one
// event end to end: its own Redis client and Postgres pool, a schema of its
// own migrated with migrations.Up and dropped at the end, a consumer, a
// reaper and an audit schedule started and stopped, the charge made at the
// repository's Stripe emulator, the ledger row charged, a clean audit.
func TestBilling(t *testing.T) {
	ctx := t.Context()
	rdb, pool := services(t)

	suffix := randomHex(t)
	schema := "embed_" + suffix
	m, err := migrations.New(pool, schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		_, err := pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}

	stream := "embed-billing-" + suffix
	t.Cleanup(func() { rdb.Del(context.Background(), stream, stream+":dead") })

	sim := startEmulator(t)
	const key = "sk_test_embed"
	b, err := NewBilling(Options{
		Redis: rdb, DB: pool, Schema: schema, StripeKey: key, StripeBase: sim,
		Stream: stream, Group: "billing-group", Namespace: "embed-" + suffix,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Minute)
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Stop(sctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}
	t.Cleanup(stop)

	ev := event.Event{CustomerID: "c_embed", StripeCustomerID: "cus_embed", AmountCents: 2500,
		BillingPeriod: "2026-11", Currency: "usd"}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{event.PayloadField: ev.Payload()}}).Err(); err != nil {
		t.Fatal(err)
	}

	// The consumer works in its own goroutines and the charge is made in
	// another process, so no in-process signal exists: watch the ledger, the
	// outcome a team's own service would look at, with a deadline.
	records := pgx.Identifier{schema, "billing_records"}.Sanitize()
	deadline := time.Now().Add(30 * time.Second)
	for status := ""; status != "charged"; {
		err := pool.QueryRow(ctx, "SELECT status FROM "+records+" WHERE customer_id = $1 AND billing_period = $2",
			ev.CustomerID, ev.BillingPeriod).Scan(&status)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger row status %q after 30s, want charged", status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()

	var charged int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+records+" WHERE status = 'charged'").Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if charged != 1 {
		t.Errorf("ledger has %d charged rows, want 1", charged)
	}
	if n := emulatorCharges(t, sim, ev.CustomerID); n != 1 {
		t.Errorf("emulator holds %d succeeded charges for %s, want 1", n, ev.CustomerID)
	}
	// The same count through the public adapter's listing.
	sc, err := stripeapi.New(stripeapi.Config{APIKey: key, BaseURL: sim})
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	err = sc.ListCharges(ctx, start, time.Now().Add(time.Minute), func(ch stripeapi.Charge) error {
		if ch.Status == "succeeded" && ch.Metadata[stripeapi.MetaCustomerID] == ev.CustomerID {
			listed++
		}
		return nil
	})
	if err != nil || listed != 1 {
		t.Errorf("stripeapi.ListCharges: %d charges for %s, %v; want 1", listed, ev.CustomerID, err)
	}
	if p, err := rdb.XPending(ctx, stream, "billing-group").Result(); err != nil || p.Count != 0 {
		t.Errorf("pending entries %+v, %v; want the event acked", p, err)
	}

	rep, err := b.Auditor.Run(ctx, audit.Window{From: start, To: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OpenFindings != 0 || rep.PelguardCharges != 1 || rep.LedgerCharged != 1 {
		t.Errorf("audit: %d open findings, %d pelguard charges, %d charged rows; want 0, 1, 1 (%+v)",
			rep.OpenFindings, rep.PelguardCharges, rep.LedgerCharged, rep.Findings)
	}
}

// services connects to the Redis and Postgres the Makefile provides.
func services(t *testing.T) (*redis.Client, *pgxpool.Pool) {
	t.Helper()
	ropt, err := redis.ParseURL(cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(ropt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis: %v (set REDIS_URL, or run under `make test`)", err)
	}
	pool, err := pgxpool.New(t.Context(), cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("Postgres: %v (set DATABASE_URL, or run under `make test`)", err)
	}
	return rdb, pool
}

// startEmulator builds and runs the repository's cmd/stripesim (a tool of
// this module, see go.mod: its internal/ package cannot be imported from
// here) on a free loopback port, and returns its base URL.
func startEmulator(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "stripesim")
	build := exec.Command("go", "build", "-o", bin, "github.com/pelguard/pelguard/cmd/stripesim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building stripesim: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--addr", "127.0.0.1:0")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	// Its first line on stdout is its URL.
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		s.Scan()
		line <- strings.TrimSpace(s.Text())
		for s.Scan() { // keep draining, so the emulator never blocks on a full pipe
		}
	}()
	select {
	case url := <-line:
		if !strings.HasPrefix(url, "http://") {
			t.Fatalf("stripesim printed %q, want its URL", url)
		}
		return url
	case <-time.After(30 * time.Second):
		t.Fatal("stripesim did not print its URL within 30s")
		return ""
	}
}

// emulatorCharges counts succeeded charges for a pelguard customer through
// the emulator's admin API (GET /_sim/charges).
func emulatorCharges(t *testing.T, base, customerID string) int {
	t.Helper()
	resp, err := http.Get(base + "/_sim/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var charges []struct {
		Status   string
		Metadata map[string]string
	}
	if err := json.NewDecoder(resp.Body).Decode(&charges); err != nil {
		t.Fatalf("decoding /_sim/charges: %v", err)
	}
	n := 0
	for _, ch := range charges {
		if ch.Status == "succeeded" && ch.Metadata[stripeapi.MetaCustomerID] == customerID {
			n++
		}
	}
	return n
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d_%s", os.Getpid(), hex.EncodeToString(b[:]))
}
