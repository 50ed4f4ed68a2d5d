package audit

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

const (
	testKey    = "sk_test_auditor"
	testPeriod = "2026-11"
	testNS     = "test"
)

// now is the tests' "now"; the default world window is [w0, w1).
var (
	now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w1  = now.Add(-time.Hour)
	w0  = now.Add(-25 * time.Hour)
)

type bundle struct {
	pool   *pgxpool.Pool
	sim    *stripesim.Server
	clk    *clock.Sim
	ledger *ledger.Ledger
	mem    *alerts.Memory
	cfg    Config
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := testenv.DB(t)
	sim := stripesim.MustNew(stripesim.Config{Now: now})
	t.Cleanup(sim.Close)
	clk := clock.NewSim(now)
	b := &bundle{pool: pool, sim: sim, clk: clk, ledger: ledger.New(pool, testenv.SchemaOf(pool), clk), mem: alerts.NewMemory()}
	b.cfg = Config{
		DB:       pool,
		Schema:   testenv.SchemaOf(pool),
		Stripe:   stripeapi.Config{APIKey: testKey, BaseURL: sim.URL(), MaxNetworkRetries: -1},
		Notifier: b.mem,
		Logger:   testenv.Logger(t),
		Clock:    clk,
	}
	return b
}

func (b *bundle) auditor(t testing.TB, mod func(*Config)) *Auditor {
	t.Helper()
	cfg := b.cfg
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func key(cust string) string { return event.IdempotencyKey(cust, testPeriod, testNS) }

// charge seeds a pelguard charge for cust.
func (b *bundle) charge(cust string, amount int64, created time.Time, refunded int64) string {
	return b.sim.SeedCharge(stripesim.ChargeSeed{
		Customer: "cus_" + cust, Amount: amount, Created: created, AmountRefunded: refunded,
		Metadata: stripeapi.PelguardMetadata(cust, testPeriod, key(cust)),
	}).ID
}

// row is a ledger row for cust, charged with chargeID at chargedAt (empty
// chargeID: pending).
func row(cust string, amount int64, chargeID string, chargedAt time.Time) ledger.Record {
	r := ledger.Record{Key: ledger.Key{CustomerID: cust, BillingPeriod: testPeriod}, StripeCustomerID: "cus_" + cust,
		AmountCents: amount, Currency: "usd", IdempotencyKey: key(cust), ChargeID: chargeID,
		FirstAttemptAt: chargedAt.Add(-time.Minute), ChargedAt: chargedAt, UpdatedAt: chargedAt}
	if chargeID == "" {
		r.Status = ledger.StatusPending
	}
	return r
}

func (b *bundle) seed(t testing.TB, recs ...ledger.Record) {
	t.Helper()
	if _, err := b.ledger.SeedForTest(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
}

// simRefund is one refund as the emulator's API lists it.
type simRefund struct {
	ID     string `json:"id"`
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
	Reason string `json:"reason"`
}

// refunds lists the emulator's refunds over its HTTP API (the test does
// not call stripe-go: only the adapter does).
func (b *bundle) refunds(t testing.TB) []simRefund {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.sim.URL()+"/v1/refunds?limit=100", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []simRefund `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Data
}

func byKind(fs []Finding) map[Kind][]Finding {
	out := map[Kind][]Finding{}
	for _, f := range fs {
		out[f.Kind] = append(out[f.Kind], f)
	}
	return out
}
