package console

import (
	"context"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/internal/ledger"
)

// Issue 25 item 3: a row the ledger parked is visible as stuck — on the
// overview, with why and where to go, and on the customer's periods.
func TestParkedRowShownAsStuck(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	if _, err := b.ledger.SeedForTest(ctx, []ledger.Record{
		{Key: ledger.Key{CustomerID: "c4", BillingPeriod: testPeriod}, StripeCustomerID: "cus_c4", AmountCents: 900, IdempotencyKey: key("c4"), Status: ledger.StatusPending},
		{Key: ledger.Key{CustomerID: "c5", BillingPeriod: testPeriod}, StripeCustomerID: "cus_c5", AmountCents: 700, IdempotencyKey: key("c5"), Status: ledger.StatusPending},
	}); err != nil {
		t.Fatal(err)
	}
	c := b.login(t, "alice")
	if over := c.mustGet("/"); strings.Contains(over, "retries parked") {
		t.Fatal("nothing is parked yet")
	}
	if _, err := b.pool.Exec(ctx, `UPDATE {schema}.billing_records SET attempt = 2, parked_at = $1,
		parked_reason = 'parked after 11 tries of attempt 2: closing attempt 1''s payment intent pi_x: 403'
		WHERE customer_id = 'c4'`, now); err != nil {
		t.Fatal(err)
	}
	over := c.mustGet("/")
	for _, want := range []string{"Stuck: retries parked", "/customer?customer=c4&amp;period=" + testPeriod, "payment intent pi_x: 403", "retry --period P --customer C"} {
		if !strings.Contains(over, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if strings.Contains(over, "customer=c5&amp;") {
		t.Error("a pending row that is not parked is listed as parked")
	}
	if cust := c.mustGet("/customer?customer=c4&period=" + testPeriod); !strings.Contains(cust, "parked") {
		t.Error("the customer page does not say the row is parked")
	}
}
