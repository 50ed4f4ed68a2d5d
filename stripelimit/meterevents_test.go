package stripelimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

func TestForMeterEventsIsAScheduleOfItsOwn(t *testing.T) {
	t.Parallel()
	base := stripelimit.Config{Account: "acct_1", Rate: 100, Burst: 7, FallbackRate: 9, EndpointRate: 25,
		RedriveFloor: 0.2, Role: stripelimit.RoleRedrive, Registerer: prometheus.NewRegistry()}
	m := base.ForMeterEvents()
	if m.Account != "acct_1"+stripelimit.MeterEventsSuffix || m.Rate != stripelimit.MeterEventsRate || m.Burst != 0 ||
		m.FallbackRate != 0 || m.EndpointRate != 0 || m.Registerer != nil || m.Role != stripelimit.RoleRedrive || m.RedriveFloor != 0.2 {
		t.Fatalf("ForMeterEvents = %+v", m)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := (stripelimit.Config{Rate: 100}).ForMeterEvents().Account; got != stripelimit.DefaultAccount+stripelimit.MeterEventsSuffix {
		t.Fatalf("default account's meter schedule %q", got)
	}
	if err := (stripelimit.Config{Account: strings.Repeat("a", 60), Rate: 1}).ForMeterEvents().Validate(); err == nil {
		t.Fatal("an account name too long for the suffix was accepted")
	}
}

// Live meter events have their own limit at Stripe: through MeterLimiter
// they go at the meter-events rate while the account's schedule is spent;
// through the account's limiter (test mode) they wait on it.
func TestMeterEventsDoNotDrawOnTheAccountSchedule(t *testing.T) {
	t.Parallel()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	if _, err := sim.CreateBillingMeter(stripesim.BillingMeterSeed{EventName: "api_calls"}); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	account := "mtr" + testenv.Suffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, a := range []string{account, account + stripelimit.MeterEventsSuffix} {
			keys, _ := rdb.Keys(ctx, stripelimit.KeyPrefix+"{"+a+"}*").Result()
			if len(keys) > 0 {
				_ = rdb.Del(ctx, keys...).Err()
			}
		}
	})
	cfg := stripelimit.Config{Account: account, Rate: 4, Burst: 1, Redis: rdb, Backoff: -1, Logger: testenv.Logger(t)}
	general, err := stripelimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	meter, err := stripelimit.New(cfg.ForMeterEvents())
	if err != nil {
		t.Fatal(err)
	}
	send := func(c *stripeapi.Client, label string, n int, within time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), within)
		defer cancel()
		for i := range n {
			ev := stripeapi.MeterEvent{EventName: "api_calls", StripeCustomerID: "cus_a", Value: 1,
				Identifier: label + "-" + strconv.Itoa(i)}
			if _, err := c.SendMeterEvent(ctx, ev); err != nil {
				return err
			}
		}
		return nil
	}
	newClient := func(meterLim stripeapi.Limiter) *stripeapi.Client {
		c, err := stripeapi.New(stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: stripeapi.NoRetries,
			Limiter: general, MeterLimiter: meterLim})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Spend the account's schedule: a second of it ahead.
	for range 5 {
		if err := general.Wait(t.Context(), "GET /v1/charges"); err != nil {
			t.Fatal(err)
		}
	}
	// 30 meter events at the account's 4/s would take 7 s.
	if err := send(newClient(meter), "own", 30, 3*time.Second); err != nil {
		t.Fatalf("meter events through their own schedule: %v", err)
	}
	if err := send(newClient(nil), "shared", 30, 2*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("meter events through the account's schedule (4/s) sent 30 in 2 s: %v", err)
	}
}
