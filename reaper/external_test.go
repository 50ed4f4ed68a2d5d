package reaper_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/teamsys"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	extPeriod  = "2026-11"
	extMaxCall = 100 * time.Millisecond
	extMinIdle = 2 * extMaxCall
)

func extEvent(i string) event.Event {
	return event.Event{CustomerID: "c_" + i, StripeCustomerID: "cus_" + i, AmountCents: 1500, BillingPeriod: extPeriod, Currency: "usd"}
}

// extReaper is pelguard's reaper over the team's env: pelguard's own
// schema (migrated, in the same database) for its leases, the team's
// billing_records as the ledger, the emulator in charges mode.
func extReaper(t *testing.T, env *teamsys.Env, name string, dryRun bool) *reaper.Reaper {
	t.Helper()
	pool := testenv.DB(t)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges,
		MaxNetworkRetries: -1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := reaper.Config{
		Redis: env.Redis, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Name: name,
		Streams: []reaper.StreamGroup{{Stream: env.Stream, Group: env.Group}},
		MinIdle: extMinIdle, Namespace: teamsys.IdempotencyNamespace, DryRun: dryRun,
		ExternalLedger: env.Schema + ".billing_records", ExternalMaxCall: extMaxCall,
		Logger: testenv.Logger(t),
	}
	if dryRun {
		cfg.Stripe = nil
	}
	r, err := reaper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// abandon reads ev's new entry as a team consumer that then vanishes
// (killed before anything), leaving it pending.
func abandon(t *testing.T, env *teamsys.Env, consumerName string) {
	t.Helper()
	if err := env.Redis.XReadGroup(context.Background(), &redis.XReadGroupArgs{
		Group: env.Group, Consumer: consumerName, Streams: []string{env.Stream, ">"}, Count: 100,
	}).Err(); err != nil {
		t.Fatal(err)
	}
}

// teamBilledUnacked is an entry the team billed (charged, row written) and
// left unacked (killed before XACK, or an AOF rollback brought it back).
func teamBilledUnacked(t *testing.T, env *teamsys.Env, ev event.Event) string {
	t.Helper()
	ctx := context.Background()
	env.Publish(t, ev)
	abandon(t, env, "worker-killed-before-xack")
	sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sc.Charge(ctx, stripeapi.ChargeRequest{IdempotencyKey: ev.Key(teamsys.IdempotencyNamespace),
		StripeCustomerID: ev.StripeCustomerID, AmountCents: ev.AmountCents, Currency: "usd", Description: "Usage billing for " + ev.BillingPeriod})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec(ctx, `INSERT INTO `+pgx.Identifier{env.Schema, "billing_records"}.Sanitize()+`
		(customer_id, billing_period, charge_id, amount_cents, status, created_at) VALUES ($1, $2, $3, $4, 'charged', NOW())`,
		ev.CustomerID, ev.BillingPeriod, ch.ID, ev.AmountCents); err != nil {
		t.Fatal(err)
	}
	return ch.ID
}

func waitAllIdle(t *testing.T, env *teamsys.Env, idle time.Duration) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		pe, err := env.Redis.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: env.Stream, Group: env.Group, Start: "-", End: "+", Count: 100}).Result()
		if err != nil {
			return false
		}
		for _, p := range pe {
			if p.Idle < idle+20*time.Millisecond {
				return false
			}
		}
		return true
	}, "pending entries idle past min-idle")
}

// The article's consumer is SIGKILLed between Stripe's reply and its INSERT;
// another entry the team billed is left unacked; 25 h pass (Stripe forgets
// the keys). pelguard's reaper in place of the monitor asks Stripe first and
// records the team's charge: one charge per customer, and the team's entry
// is acked without a Stripe call. The naive monitor in the same world
// charges the killed consumer's customer twice (so the test can fail).
func TestExternalLedgerKilledTeamConsumerAcrossKeyWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		monitor bool
		want    int // charges of the killed consumer's customer
	}{
		{name: "pelguard's reaper", want: 1},
		{name: "the naive monitor double-charges", monitor: true, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := teamsys.Setup(t)
			acked, killed, unacked := extEvent("1"), extEvent("2"), extEvent("3")
			env.Publish(t, acked)
			env.Publish(t, killed)
			c := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-1", KillAfterCharges: 2})
			if exit := c.Wait(30 * time.Second); !exit.Killed() {
				t.Fatalf("team consumer ended with %s, want SIGKILL after the second charge", exit)
			}
			teamCharge := teamBilledUnacked(t, env, unacked)
			chargesBefore := env.Sim.Requests()["POST /v1/charges"]
			env.Sim.Advance(25 * time.Hour)
			waitAllIdle(t, env, extMinIdle)

			if tc.monitor {
				m := env.Start(t, teamsys.Config{Role: teamsys.RoleMonitor, MinIdle: extMinIdle, Interval: 20 * time.Millisecond})
				testenv.Eventually(t, 30*time.Second, func() bool { return env.Pending(t) == 0 }, "monitor drained the PEL")
				m.Stop()
			} else {
				r := extReaper(t, env, "reaper-1", false)
				sum, err := r.RunOnce(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if sum.Decisions[reaper.KindAlreadyBilled] != 1 || sum.Decisions[reaper.KindClaim] != 1 {
					t.Errorf("decisions %v, want 1 already_billed (the team's unacked entry) and 1 claim", sum.Decisions)
				}
				if n := env.Sim.Requests()["POST /v1/charges"]; n != chargesBefore {
					t.Errorf("%d charge requests after the reaper, want %d: it must ask Stripe, find the team's charge and not charge", n, chargesBefore)
				}
				if n := env.Pending(t); n != 0 {
					t.Errorf("%d entries still pending", n)
				}
			}

			for _, ev := range []event.Event{acked, unacked} {
				if n := len(env.Charges(ev.StripeCustomerID, extPeriod)); n != 1 {
					t.Errorf("%s: %d charges, want 1", ev.CustomerID, n)
				}
			}
			chs := env.Charges(killed.StripeCustomerID, extPeriod)
			if len(chs) != tc.want {
				t.Fatalf("%s: %d charges, want %d", killed.CustomerID, len(chs), tc.want)
			}
			if tc.monitor {
				return
			}
			rows := env.Rows(t)
			if len(rows) != 3 {
				t.Fatalf("team rows %+v, want one per customer", rows)
			}
			for _, row := range rows {
				want := env.Charges("cus_"+row.CustomerID[2:], extPeriod)
				if row.Status != "charged" || len(want) != 1 || row.ChargeID != want[0].ID {
					t.Errorf("team row %+v, want charged with the charge Stripe has (%+v)", row, want)
				}
			}
			if rows[2].ChargeID != teamCharge {
				t.Errorf("the team's own row changed: %+v", rows[2])
			}
		})
	}
}

// Two reapers at once over the same abandoned entries, and an event
// re-published under a fresh stream id: one charge per customer.
func TestExternalLedgerTwoReapersOneChargeEach(t *testing.T) {
	t.Parallel()
	env := teamsys.Setup(t)
	evs := []event.Event{extEvent("a"), extEvent("b"), extEvent("c"), extEvent("d")}
	for _, ev := range evs {
		env.Publish(t, ev)
	}
	env.Publish(t, evs[0]) // re-published: same key, new entry
	abandon(t, env, "worker-gone")
	waitAllIdle(t, env, extMinIdle)
	r1, r2 := extReaper(t, env, "reaper-1", false), extReaper(t, env, "reaper-2", false)
	var wg sync.WaitGroup
	for _, r := range []*reaper.Reaper{r1, r2} {
		wg.Go(func() {
			if _, err := r.RunOnce(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Anything left (a lease busy, a claim lost) goes on the next passes.
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, _ = r1.RunOnce(t.Context())
		return env.Pending(t) == 0
	}, "PEL drained")
	for _, ev := range evs {
		if n := len(env.Charges(ev.StripeCustomerID, extPeriod)); n != 1 {
			t.Errorf("%s: %d charges, want 1", ev.CustomerID, n)
		}
	}
	if rows := env.Rows(t); len(rows) != len(evs) {
		t.Errorf("team rows %+v, want %d", rows, len(evs))
	}
}

// --dry-run against the team's database reads only and shows
// already_billed for the entries the team billed and left unacked.
func TestExternalLedgerDryRunShowsAlreadyBilled(t *testing.T) {
	t.Parallel()
	env := teamsys.Setup(t)
	teamBilledUnacked(t, env, extEvent("1"))
	env.Publish(t, extEvent("2"))
	abandon(t, env, "worker-gone")
	waitAllIdle(t, env, extMinIdle)
	sum, err := extReaper(t, env, "reaper-dry", true).RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Decisions[reaper.KindAlreadyBilled] != 1 || sum.Decisions[reaper.KindClaim] != 1 {
		t.Errorf("decisions %v, want already_billed 1 and claim 1", sum.Decisions)
	}
	if n := env.Pending(t); n != 2 {
		t.Errorf("%d pending after a dry run, want 2", n)
	}
	if rows := env.Rows(t); len(rows) != 1 {
		t.Errorf("team rows %+v after a dry run, want the one the team wrote", rows)
	}
}

// New refuses MinIdle below 2 × ExternalMaxCall, naming both.
func TestExternalLedgerConfigRefusesShortMinIdle(t *testing.T) {
	t.Parallel()
	_, err := reaper.New(reaper.Config{Redis: testenv.Redis(t), DB: testenv.DB(t), DryRun: true,
		Streams: []reaper.StreamGroup{{Stream: "s", Group: "g"}}, MinIdle: time.Minute,
		ExternalLedger: "public.billing_records", ExternalMaxCall: 90 * time.Second})
	if err == nil || !contains(err.Error(), "--min-idle 1m0s", "--external-max-call 1m30s") {
		t.Fatalf("New: %v, want a refusal naming --min-idle and --external-max-call", err)
	}
}

func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// Reclaim while in flight, in external-ledger mode: the team's live
// consumer is inside Stripe calls slower than the old monitor's min-idle
// would tolerate, but within --external-max-call. pelguard's reaper, whose
// min-idle is at least twice that, claims none of its entries and Stripe
// sees one charge request per customer; the naive monitor with the old
// threshold reclaims them mid-call (the control: more charge requests than
// customers; the content-hash key keeps them from charging twice within
// 24 h, which is why the 25 h test above is the one that counts charges).
func TestExternalLedgerSlowLiveTeamConsumerIsNotReclaimed(t *testing.T) {
	t.Parallel()
	const latency, maxCall = 600 * time.Millisecond, 800 * time.Millisecond
	for _, naive := range []bool{false, true} {
		t.Run(map[bool]string{false: "pelguard", true: "naive monitor"}[naive], func(t *testing.T) {
			t.Parallel()
			env := teamsys.Setup(t)
			if err := env.Sim.SetFaults(stripesim.Faults{Latency: stripesim.Latency{Fixed: latency}}); err != nil {
				t.Fatal(err)
			}
			const n = 3
			for i := range n {
				env.Publish(t, extEvent(fmt.Sprint(i)))
			}
			team := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer, Consumer: "worker-slow"})
			var claims atomic.Int64
			if naive {
				// The old monitor's threshold, below the Stripe call.
				m := env.Start(t, teamsys.Config{Role: teamsys.RoleMonitor, MinIdle: latency / 3, Interval: 20 * time.Millisecond})
				defer m.Stop()
			} else {
				pool := testenv.DB(t)
				sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1})
				if err != nil {
					t.Fatal(err)
				}
				r, err := reaper.New(reaper.Config{
					Redis: env.Redis, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Name: "reaper-slow",
					Streams: []reaper.StreamGroup{{Stream: env.Stream, Group: env.Group}},
					MinIdle: 2 * maxCall, Interval: 20 * time.Millisecond, Namespace: teamsys.IdempotencyNamespace,
					ExternalLedger: env.Schema + ".billing_records", ExternalMaxCall: maxCall, Logger: testenv.Logger(t),
					OnDecision: func(d reaper.Decision) {
						if d.Kind == reaper.KindClaim {
							claims.Add(1)
						}
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = r.Stop(context.Background()) }()
			}
			testenv.Eventually(t, 60*time.Second, func() bool { return len(env.Rows(t)) == n && env.Pending(t) == 0 }, "billed and acked")
			team.Stop()
			total := 0
			for i := range n {
				total += len(env.Charges("cus_"+fmt.Sprint(i), extPeriod))
			}
			posts := env.Sim.Requests()["POST /v1/charges"]
			switch {
			case total != n:
				t.Fatalf("%d charges for %d customers", total, n)
			case naive && posts <= n:
				t.Fatalf("the naive monitor made %d charge requests for %d customers; the control expects reclaims mid-call", posts, n)
			case !naive && (posts != n || claims.Load() != 0):
				t.Fatalf("%d charge requests for %d customers and %d claims; want one each and no claim", posts, n, claims.Load())
			}
		})
	}
}

// A team table of another shape: reads through a view with the article's
// columns, writes through the configured INSERT. The abandoned entry is
// charged once and its outcome lands in the team's own table.
func TestExternalLedgerConfiguredInsertForAnotherShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := teamsys.Setup(t)
	sch := pgx.Identifier{env.Schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE TABLE ` + sch + `.invoices (cust text NOT NULL, period text NOT NULL, ch text, cents bigint, state text NOT NULL, err text, PRIMARY KEY (cust, period))`,
		`CREATE VIEW ` + sch + `.invoice_ledger AS SELECT cust AS customer_id, period AS billing_period, ch AS charge_id, state AS status FROM ` + sch + `.invoices`,
	} {
		if _, err := env.DB.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	ev := extEvent("shape")
	env.Publish(t, ev)
	abandon(t, env, "worker-gone")
	waitAllIdle(t, env, extMinIdle)
	pool := testenv.DB(t)
	sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reaper.New(reaper.Config{
		Redis: env.Redis, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Name: "reaper-shape",
		Streams: []reaper.StreamGroup{{Stream: env.Stream, Group: env.Group}},
		MinIdle: extMinIdle, Namespace: teamsys.IdempotencyNamespace,
		ExternalLedger: env.Schema + ".invoice_ledger", ExternalMaxCall: extMaxCall,
		ExternalInsert: `INSERT INTO ` + sch + `.invoices (cust, period, ch, cents, state, err) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		Logger:         testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(env.Charges(ev.StripeCustomerID, ev.BillingPeriod)); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	var ch, state string
	if err := env.DB.QueryRow(ctx, `SELECT coalesce(ch, ''), state FROM `+sch+`.invoices WHERE cust = $1`, ev.CustomerID).Scan(&ch, &state); err != nil || ch == "" || state != "charged" {
		t.Fatalf("the team's own table: %q %q %v", ch, state, err)
	}
	if env.Pending(t) != 0 {
		t.Fatal("the entry is still pending after the write")
	}
	if _, err := reaper.New(reaper.Config{Redis: env.Redis, DB: pool, Streams: []reaper.StreamGroup{{Stream: "s", Group: "g"}},
		MinIdle: extMinIdle, ExternalLedger: "public.t", ExternalMaxCall: extMaxCall, ExternalInsert: "DELETE FROM x", DryRun: true}); err == nil {
		t.Fatal("an --external-insert without parameters was accepted")
	}
}

// A re-drive whose card is declined writes the team's row as the team's
// consumer does ('card_declined', the error, no charge) and acks; a
// re-drive past pelguard's spend cap charges nothing and is dead-lettered.
func TestExternalLedgerDeclineAndSpendCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := teamsys.Setup(t)
	declined, capped := extEvent("declined"), extEvent("capped")
	capped.BillingPeriod = "2026-12"
	if err := env.Sim.SetFaults(stripesim.Faults{DeclineCustomers: []string{declined.StripeCustomerID}}); err != nil {
		t.Fatal(err)
	}
	env.Publish(t, declined)
	env.Publish(t, capped)
	abandon(t, env, "worker-gone")
	waitAllIdle(t, env, extMinIdle)
	pool := testenv.DB(t)
	if _, err := ledger.New(pool, testenv.SchemaOf(pool), nil).SetCap(ctx, "2026-12", 100); err != nil {
		t.Fatal(err)
	}
	sc, err := stripeapi.New(stripeapi.Config{APIKey: teamsys.DefaultStripeKey, BaseURL: env.Sim.URL(), Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reaper.New(reaper.Config{
		Redis: env.Redis, DB: pool, Schema: testenv.SchemaOf(pool), Stripe: sc, Name: "reaper-decline",
		Streams: []reaper.StreamGroup{{Stream: env.Stream, Group: env.Group}},
		MinIdle: extMinIdle, Namespace: teamsys.IdempotencyNamespace,
		ExternalLedger: env.Schema + ".billing_records", ExternalMaxCall: extMaxCall, Logger: testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	rows := map[string]teamsys.Row{}
	for _, row := range env.Rows(t) {
		rows[row.CustomerID] = row
	}
	if row, ok := rows[declined.CustomerID]; !ok || row.Status != "card_declined" || row.ChargeID != "" || row.Error == "" {
		t.Fatalf("the declined re-drive's row: %+v (%v)", row, ok)
	}
	if _, ok := rows[capped.CustomerID]; ok {
		t.Fatal("a re-drive past the spend cap wrote the team's table")
	}
	if n := len(env.Charges(declined.StripeCustomerID, declined.BillingPeriod)) + len(env.Charges(capped.StripeCustomerID, capped.BillingPeriod)); n != 0 {
		t.Fatalf("%d succeeded charges, want 0 (one declined, one capped)", n)
	}
	if n := env.Sim.Requests()["POST /v1/charges"]; n != 1 {
		t.Fatalf("%d charge requests, want 1 (the declined one; the capped one is never sent)", n)
	}
	dead, err := env.Redis.XRange(ctx, env.Stream+":dead", "-", "+").Result()
	if err != nil || len(dead) != 1 || dead[0].Values["reason"] != "spend_cap" {
		t.Fatalf("dead letters %v (%v), want the capped event as spend_cap", dead, err)
	}
	testenv.CleanupKeys(t, env.Redis, env.Stream+":dead")
	if env.Pending(t) != 0 {
		t.Fatal("entries left pending")
	}
}
