package consumercli

import (
	"context"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Issue 25 item 7: `consumer retry --period P` re-presents only the bank
// debits their rules allow; debit_not_authorized and a debit past its
// re-presentments are refused (listed, with why) unless --override gives a
// reason, which is recorded on the row.
func TestRetryRespectsDebitRules(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	schema := testenv.SchemaOfURL(url)
	l := ledger.New(pool, schema, nil)
	ctx := context.Background()
	debit := func(i int, code string) event.Event {
		e := event.Event{CustomerID: "c_" + code, StripeCustomerID: "cus_" + code, AmountCents: int64(500 + i), BillingPeriod: "2026-11", Currency: "usd"}
		chargeID := "ch_debit_" + code
		seedRow(t, l, e, ledger.Outcome{Status: ledger.StatusProcessing, ChargeID: chargeID, PaymentIntentID: "pi_" + code})
		if _, err := l.Settle(ctx, ledger.EventKey(e), ledger.Settlement{ChargeID: chargeID, FailureCode: code, Error: "returned"}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	revoked := debit(1, "debit_not_authorized")
	funds := debit(2, "insufficient_funds")
	card := event.Event{CustomerID: "c_card", StripeCustomerID: "cus_card", AmountCents: 900, BillingPeriod: "2026-11", Currency: "usd"}
	seedRow(t, l, card, ledger.Outcome{Status: ledger.StatusDeclined, FailureCode: "stolen_card", Error: "declined"})

	base := []string{"retry", "--database-url", url, "--db-schema", schema, "--period", "2026-11"}
	code, out, errs := call(ctx, base...)
	if code != 0 || !strings.Contains(out, "scheduled 2 retry") || !strings.Contains(out, "refused 1") ||
		!strings.Contains(out, "c_debit_not_authorized/2026-11: bank debit failed with debit_not_authorized") {
		t.Fatalf("retry: %d\n%s\n%s", code, out, errs)
	}
	get := func(e event.Event) ledger.Record {
		r, err := l.Get(ctx, ledger.EventKey(e))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := get(revoked); !r.NextAttemptAt.IsZero() {
		t.Fatalf("debit_not_authorized was scheduled: %+v", r)
	}
	if get(funds).NextAttemptAt.IsZero() || get(card).NextAttemptAt.IsZero() {
		t.Fatal("the retryable debit and the card must be scheduled")
	}

	if code, _, errs := call(ctx, append(base, "--override", "  ")...); code != 2 || !strings.Contains(errs, "--override needs a reason") {
		t.Fatalf("an empty reason: %d %s", code, errs)
	}
	code, out, errs = call(ctx, append(base, "--customer", revoked.CustomerID, "--override", "new mandate signed 2026-12-01, ticket 4711")...)
	if code != 0 || !strings.Contains(out, "scheduled 1 retry") {
		t.Fatalf("override: %d\n%s\n%s", code, out, errs)
	}
	if r := get(revoked); r.NextAttemptAt.IsZero() || !strings.Contains(r.RetryOverride, "new mandate signed 2026-12-01, ticket 4711 (by ") {
		t.Fatalf("the override must schedule and record its reason: %+v", r)
	}
}
