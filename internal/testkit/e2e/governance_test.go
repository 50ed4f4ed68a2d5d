package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// A restricted key is accepted; one that lacks PaymentIntents write gets
// Stripe's 403: the event ends failed and dead-lettered after ONE request
// (stripe-go does not retry a 403, the consumer does not either), and the
// permission_denied alert names the missing permission. The ledger row stays
// pending (chargeable once the key is fixed) and the entry is parked in the
// dead-letter stream with reason stripe_key_error.
func TestRestrictedKeyAnd403(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	sim.SetKeyPermissions(restrictedKey, "charges_read", "payment_intents_read")
	_, dbURL := testenv.DBWithURL(t)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")
	ev := event.Event{CustomerID: "c_403", StripeCustomerID: "cus_403", AmountCents: 1200, BillingPeriod: "2026-11", Currency: "usd"}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": ev.Payload()}}).Err(); err != nil {
		t.Fatal(err)
	}
	// No Slack: the log notifier writes the alert to the log.
	env := baseEnv("DATABASE_URL="+withPassword(t, dbURL), "REDIS_URL="+testenv.RedisURL(),
		"STRIPE_API_KEY="+restrictedKey, "STRIPE_API_BASE="+sim.URL())
	p := startBin(t, "consumer", env, "--stream", stream, "--metrics-addr", "127.0.0.1:0", "--block", "100ms", "--stripe-retries", "3")
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, _ := rdb.XLen(ctx, stream+":dead").Result()
		pend, _ := rdb.XPending(ctx, stream, "billing-group").Result()
		return n == 1 && pend != nil && pend.Count == 0
	}, "dead-lettered and acked: %s", p.out)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(p.out.String(), "permission_denied")
	}, "permission alert logged")
	// Give a retry loop the time it would need to show itself.
	time.Sleep(500 * time.Millisecond)
	out := p.stop()
	if n := sim.Requests()["POST /v1/payment_intents"]; n != 1 {
		t.Errorf("%d payment intent requests, want exactly 1 (a 403 must not be retried)\n%s", n, out)
	}
	if sim.ChargeCreates() != 0 {
		t.Error("a charge was made")
	}
	dl, err := rdb.XRange(ctx, stream+":dead", "-", "+").Result()
	if err != nil || len(dl) != 1 || dl[0].Values["reason"] != "stripe_key_error" {
		t.Fatalf("dead letters %v %v", dl, err)
	}
	for _, want := range []string{"rak_payment_intent_write", "Stripe key lacks a permission"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "charge_failed") {
		t.Errorf("a 403 should alert permission_denied once, not charge_failed per event:\n%s", out)
	}
}

// An sk_live_ key is refused by every binary without --allow-unrestricted-key
// (exit 2, a message naming the fix), and accepted with it, with a warning.
func TestLiveKeyNeedsFlag(t *testing.T) {
	t.Parallel()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	_, dbURL := testenv.DBWithURL(t)
	env := baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+liveKey, "STRIPE_API_BASE="+sim.URL())
	for bin, args := range map[string][]string{
		"consumer": {"--metrics-addr", ""},
		"reaper":   {"--once", "--metrics-addr", ""},
		"auditor":  {"run", "--from", "2026-01-01", "--to", "2026-01-02"},
	} {
		res := runBin(t, bin, env, time.Minute, args...)
		if res.code != 2 || !strings.Contains(res.out, "refusing an unrestricted live key") || !strings.Contains(res.out, "rk_live_") {
			t.Errorf("%s with sk_live_: exit %d\n%s", bin, res.code, res.out)
		}
	}
	for bin, args := range map[string][]string{
		"reaper":  {"--once", "--metrics-addr", "", "--allow-unrestricted-key"},
		"auditor": {"run", "--from", "2026-01-01", "--to", "2026-01-02", "--allow-unrestricted-key"},
	} {
		res := runBin(t, bin, env, time.Minute, args...)
		if res.code != 0 || !strings.Contains(res.out, "unrestricted live Stripe key") {
			t.Errorf("%s with sk_live_ and --allow-unrestricted-key: exit %d\n%s", bin, res.code, res.out)
		}
	}
	// rk_ keys are accepted as they are.
	sim.SetKeyPermissions(restrictedKey, "charges_read", "payment_intents_read", "payment_intents_write", "customers_read")
	env = baseEnv("DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(), "STRIPE_API_KEY="+restrictedKey, "STRIPE_API_BASE="+sim.URL())
	if res := runBin(t, "reaper", env, time.Minute, "--once", "--metrics-addr", ""); res.code != 0 {
		t.Errorf("reaper with rk_: exit %d\n%s", res.code, res.out)
	}
	if res := runBin(t, "auditor", env, time.Minute, "run", "--from", "2026-01-01", "--to", "2026-01-02"); res.code != 0 {
		t.Errorf("auditor with rk_: exit %d\n%s", res.code, res.out)
	}
}

// The auditor with a key lacking Charges read: the run fails (exit 2), the
// message names the permission, and it is alerted.
func TestAuditor403(t *testing.T) {
	t.Parallel()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	sim.SetKeyPermissions(restrictedKey, "refunds_write")
	_, dbURL := testenv.DBWithURL(t)
	env := baseEnv("DATABASE_URL="+dbURL, "STRIPE_API_KEY="+restrictedKey, "STRIPE_API_BASE="+sim.URL())
	res := runBin(t, "auditor", env, time.Minute, "run", "--from", "2026-01-01", "--to", "2026-01-02")
	if res.code != 2 {
		t.Errorf("exit %d\n%s", res.code, res.out)
	}
	for _, want := range []string{"rak_charge_read", "permission_denied"} {
		if !strings.Contains(res.out, want) {
			t.Errorf("output lacks %q:\n%s", want, res.out)
		}
	}
	if n := sim.Requests()["GET /v1/charges"]; n > 4 {
		t.Errorf("%d list requests: a 403 must not be retried", n)
	}
}
