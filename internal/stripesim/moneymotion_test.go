package stripesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
)

func offSessionIntent(customer string, amount int64, key string) *stripe.PaymentIntentParams {
	p := &stripe.PaymentIntentParams{
		Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(customer),
		Confirm: stripe.Bool(true), OffSession: stripe.Bool(true), Description: stripe.String("Usage billing for 2024-04"),
	}
	p.AddMetadata("billing_period", "2024-04")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func TestDebitIntentIsProcessingUntilSettledSucceeded(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DebitCustomers: []string{"cus_ach"}}})
	pi, err := sc.PaymentIntents.New(offSessionIntent("cus_ach", 5000, "k-debit"))
	if err != nil {
		t.Fatal(err)
	}
	if pi.Status != stripe.PaymentIntentStatusProcessing || pi.LatestCharge == nil || pi.AmountReceived != 0 {
		t.Fatalf("debit create: status %s latest %v received %d", pi.Status, pi.LatestCharge, pi.AmountReceived)
	}
	ch, err := sc.Charges.Get(pi.LatestCharge.ID, nil)
	if err != nil || ch.Status != stripe.ChargeStatusPending || ch.Paid {
		t.Fatalf("pending charge: %v %+v", err, ch)
	}
	// Three days later the bank confirms.
	srv.Advance(72 * time.Hour)
	if err := srv.Settle(pi.ID, true, ""); err != nil {
		t.Fatal(err)
	}
	pi, err = sc.PaymentIntents.Get(pi.ID, nil)
	if err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded || pi.AmountReceived != 5000 {
		t.Fatalf("after settle: %v %+v", err, pi)
	}
	if got, _ := srv.Charge(pi.LatestCharge.ID); got.Status != "succeeded" {
		t.Fatalf("charge after settle: %+v", got)
	}
	if err := srv.Settle(pi.ID, false, "account_closed"); !errors.Is(err, ErrNotPending) {
		t.Fatalf("settling twice: %v", err)
	}
	if srv.ChargeCreates() != 1 {
		t.Fatalf("charge creates %d", srv.ChargeCreates())
	}
}

func TestDebitFailsThroughAdminSettle(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DebitCustomers: []string{"pm_sepa"}}})
	p := offSessionIntent("cus_sepa", 700, "k-sepa")
	p.PaymentMethod = stripe.String("pm_sepa") // a debit by payment method, not customer
	pi, err := sc.PaymentIntents.New(p)
	if err != nil || pi.Status != stripe.PaymentIntentStatusProcessing {
		t.Fatalf("create: %v %+v", err, pi)
	}
	body, _ := json.Marshal(map[string]any{"id": pi.LatestCharge.ID, "succeeded": false, "failure_code": "debit_not_authorized"})
	resp, err := http.Post(srv.URL()+"/_sim/settle", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /_sim/settle: %d", resp.StatusCode)
	}
	pi, err = sc.PaymentIntents.Get(pi.ID, nil)
	if err != nil || pi.Status != stripe.PaymentIntentStatusRequiresPaymentMethod || pi.LastPaymentError == nil ||
		pi.LastPaymentError.Code != "debit_not_authorized" {
		t.Fatalf("failed debit intent: %v %+v", err, pi)
	}
	ch, _ := srv.Charge(pi.LatestCharge.ID)
	if ch.Status != "failed" || ch.FailureCode != "debit_not_authorized" {
		t.Fatalf("failed debit charge %+v", ch)
	}
	resp, err = http.Post(srv.URL()+"/_sim/settle", "application/json", bytes.NewReader([]byte(`{"id":"ch_nope","succeeded":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("settling an unknown charge: %d", resp.StatusCode)
	}
}

func TestDebitChargesModeIsPending(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DebitCustomers: []string{"cus_ach"}}})
	ch, err := sc.Charges.New(newChargeParams("cus_ach", 100, "k-ch-debit"))
	if err != nil || ch.Status != stripe.ChargeStatusPending {
		t.Fatalf("charges-mode debit: %v %+v", err, ch)
	}
	// A pending debit is money on its way: a second one for the period is
	// a duplicate.
	if _, err := sc.Charges.New(newChargeParams("cus_ach", 100, "k-ch-debit-2")); err != nil {
		t.Fatal(err)
	}
	if d := srv.Duplicates(); len(d) != 1 {
		t.Fatalf("two pending debits of one period: duplicates %+v", d)
	}
	if err := srv.Settle(ch.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := srv.Charge(ch.ID); got.Status != "failed" || got.FailureCode != "insufficient_funds" {
		t.Fatalf("settled failed without a code: %+v", got)
	}
}

func TestDeclineCodesSoftAndHard(t *testing.T) {
	t.Parallel()
	codes := append(append([]string(nil), SoftDeclineCodes...), HardDeclineCodes...)
	m := map[string]string{}
	for _, c := range codes {
		m["cus_"+c] = c
	}
	srv, sc := setup(t, Config{Faults: Faults{DeclineCodes: m}})
	for _, code := range codes {
		_, err := sc.PaymentIntents.New(offSessionIntent("cus_"+code, 100, "k-"+code))
		se := stripeErr(t, err, http.StatusPaymentRequired)
		if se.Code != stripe.ErrorCodeCardDeclined || string(se.DeclineCode) != code || se.PaymentIntent == nil ||
			se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod ||
			se.PaymentIntent.LastPaymentError == nil || string(se.PaymentIntent.LastPaymentError.DeclineCode) != code {
			t.Fatalf("%s: %+v", code, se)
		}
		ch, _ := srv.Charge(se.ChargeID)
		if ch.Status != "failed" || ch.DeclineCode != code || ch.FailureCode != "card_declined" {
			t.Fatalf("%s: failed charge %+v", code, ch)
		}
		got, err := sc.Charges.Get(se.ChargeID, nil)
		if err != nil || got.Outcome == nil || got.Outcome.Reason != code {
			t.Fatalf("%s: outcome.reason %v %+v", code, err, got.Outcome)
		}
	}
	// Charges mode carries the code too.
	_, err := sc.Charges.New(newChargeParams("cus_stolen_card", 100, "k-ch-stolen"))
	if se := stripeErr(t, err, http.StatusPaymentRequired); se.DeclineCode != "stolen_card" {
		t.Fatalf("charges mode decline %+v", se)
	}
}

// TestSoftDeclineReplaysFor24Hours: Stripe stores the 402 under the key, so
// retrying a soft decline under the same key cannot succeed for 24 h even
// when the card would now pay; after the window the key executes again.
func TestSoftDeclineReplaysFor24Hours(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{DeclineCodes: map[string]string{"cus_soft": "insufficient_funds"}}})
	_, err := sc.PaymentIntents.New(offSessionIntent("cus_soft", 100, "k-soft"))
	first := stripeErr(t, err, http.StatusPaymentRequired)
	if err := srv.SetFaults(Faults{}); err != nil { // the funds arrive
		t.Fatal(err)
	}
	srv.Advance(23 * time.Hour)
	_, err = sc.PaymentIntents.New(offSessionIntent("cus_soft", 100, "k-soft"))
	se := stripeErr(t, err, http.StatusPaymentRequired)
	if se.LastResponse.Header.Get("Idempotent-Replayed") != "true" || se.DeclineCode != "insufficient_funds" || se.ChargeID != first.ChargeID {
		t.Fatalf("replayed 402: %+v", se)
	}
	if srv.ChargeCreates() != 1 {
		t.Fatalf("a replay created a charge: %d", srv.ChargeCreates())
	}
	srv.Advance(time.Hour)
	pi, err := sc.PaymentIntents.New(offSessionIntent("cus_soft", 100, "k-soft"))
	if err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("after 24 h the key executes: %v", err)
	}
}

func TestAuthenticationRequired(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{AuthRequiredCustomers: []string{"cus_3ds"}}})
	_, err := sc.PaymentIntents.New(offSessionIntent("cus_3ds", 100, "k-3ds"))
	se := stripeErr(t, err, http.StatusPaymentRequired)
	if se.Type != stripe.ErrorTypeCard || se.Code != stripe.ErrorCodeAuthenticationRequired ||
		se.DeclineCode != "authentication_required" || se.PaymentIntent == nil ||
		se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("off-session auth required: %+v", se)
	}
	if ch, _ := srv.Charge(se.ChargeID); ch.Status != "failed" || ch.DeclineCode != "authentication_required" {
		t.Fatalf("failed charge %+v", ch)
	}
	// On session the customer could authenticate: 200, requires_action.
	p := offSessionIntent("cus_3ds", 100, "k-3ds-on")
	p.OffSession = nil
	pi, err := sc.PaymentIntents.New(p)
	if err != nil || pi.Status != stripe.PaymentIntentStatusRequiresAction || pi.NextAction == nil ||
		pi.NextAction.Type != stripe.PaymentIntentNextActionTypeUseStripeSDK || pi.LatestCharge != nil {
		t.Fatalf("on-session auth required: %v %+v", err, pi)
	}
	// Fixed (the customer authenticated and saved the card): a new key pays.
	if err := srv.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if pi, err := sc.PaymentIntents.New(offSessionIntent("cus_3ds", 100, "k-3ds-2")); err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("after the fix: %v", err)
	}
}

func TestNoPaymentMethod(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{NoPaymentMethodCustomers: []string{"cus_nopm"}}})
	_, err := sc.PaymentIntents.New(offSessionIntent("cus_nopm", 100, "k-nopm"))
	se := stripeErr(t, err, http.StatusBadRequest)
	if se.Code != stripe.ErrorCodePaymentIntentUnexpectedState || se.PaymentIntent == nil ||
		se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("no payment method: %+v", se)
	}
	_, err = sc.PaymentIntents.New(offSessionIntent("cus_nopm", 100, "k-nopm"))
	if se := stripeErr(t, err, http.StatusBadRequest); se.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the 400 executed, so it replays")
	}
	_, err = sc.Charges.New(newChargeParams("cus_nopm", 100, "k-nopm-ch"))
	stripeErr(t, err, http.StatusBadRequest)
	if srv.ChargeCreates() != 0 || len(srv.Charges()) != 0 {
		t.Fatalf("no payment method, yet charges: %+v", srv.Charges())
	}
}

func TestMoneyMotionFaultsRoundTripJSON(t *testing.T) {
	t.Parallel()
	f := Faults{DeclineCodes: map[string]string{"cus_a": "lost_card"}, DebitCustomers: []string{"cus_b"},
		AuthRequiredCustomers: []string{"cus_c"}, NoPaymentMethodCustomers: []string{"cus_d"}}
	raw, _ := json.Marshal(f.ToJSON())
	var j FaultsJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		t.Fatal(err)
	}
	back, err := j.Faults()
	if err != nil || back.DeclineCodes["cus_a"] != "lost_card" || back.DebitCustomers[0] != "cus_b" ||
		back.AuthRequiredCustomers[0] != "cus_c" || back.NoPaymentMethodCustomers[0] != "cus_d" {
		t.Fatalf("round trip %s: %v %+v", raw, err, back)
	}
	if err := (Faults{DeclineCodes: map[string]string{"cus_a": ""}}).Validate(); err == nil {
		t.Fatal("an empty decline code validated")
	}
}

func TestSeededPendingDebitSettles(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	seeded := srv.SeedCharge(ChargeSeed{Customer: "cus_ach", Amount: 300, Status: "pending", ViaIntent: true})
	pi, err := sc.PaymentIntents.Get(seeded.PaymentIntent, nil)
	if err != nil || pi.Status != stripe.PaymentIntentStatusProcessing {
		t.Fatalf("seeded debit intent: %v %+v", err, pi)
	}
	if err := srv.Settle(seeded.ID, true, ""); err != nil {
		t.Fatal(err)
	}
	if pi, err := sc.PaymentIntents.Get(seeded.PaymentIntent, nil); err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("settled seeded debit: %v", err)
	}
}

// Cancel: an intent waiting for the customer (or a payment method) can be
// cancelled, once; a succeeded or processing one answers 400
// payment_intent_unexpected_state with the intent, as Stripe does.
func TestCancelIntent(t *testing.T) {
	t.Parallel()
	_, sc := setup(t, Config{Faults: Faults{DebitCustomers: []string{"cus_ach"}, DeclineCodes: map[string]string{"cus_broke": "insufficient_funds"}}})
	_, err := sc.PaymentIntents.New(offSessionIntent("cus_broke", 100, "k-decl"))
	var se *stripe.Error
	if !errors.As(err, &se) || se.PaymentIntent == nil {
		t.Fatalf("decline: %v", err)
	}
	pi, err := sc.PaymentIntents.Cancel(se.PaymentIntent.ID, nil)
	if err != nil || pi.Status != stripe.PaymentIntentStatusCanceled {
		t.Fatalf("cancel a declined intent: %+v %v", pi, err)
	}
	_, err = sc.PaymentIntents.Cancel(pi.ID, nil)
	if !errors.As(err, &se) || se.Code != stripe.ErrorCodePaymentIntentUnexpectedState || se.PaymentIntent.Status != stripe.PaymentIntentStatusCanceled {
		t.Fatalf("cancel twice: %v", err)
	}
	debit, err := sc.PaymentIntents.New(offSessionIntent("cus_ach", 100, "k-ach"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = sc.PaymentIntents.Cancel(debit.ID, nil)
	if !errors.As(err, &se) || se.PaymentIntent.Status != stripe.PaymentIntentStatusProcessing {
		t.Fatalf("cancel a processing debit: %v", err)
	}
}
