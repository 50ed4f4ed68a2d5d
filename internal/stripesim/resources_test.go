package stripesim

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v76"
)

func intentParams(customer string, amount int64) *stripe.PaymentIntentParams {
	p := &stripe.PaymentIntentParams{
		Amount:        stripe.Int64(amount),
		Currency:      stripe.String("usd"),
		Customer:      stripe.String(customer),
		Description:   stripe.String("Usage billing for 2024-04"),
		PaymentMethod: stripe.String("pm_card_visa"),
		Confirm:       stripe.Bool(true),
		OffSession:    stripe.Bool(true),
	}
	p.AddMetadata("customer_id", "c-"+customer)
	p.AddMetadata("billing_period", "2024-04")
	return p
}

func TestPaymentIntentCreatesChargeAndExpands(t *testing.T) {
	t.Parallel()
	for _, omit := range []bool{false, true} {
		t.Run(map[bool]string{false: "charge copies metadata", true: "ChargeOmitsIntentMetadata"}[omit], func(t *testing.T) {
			t.Parallel()
			srv, sc := setup(t, Config{ChargeOmitsIntentMetadata: omit})
			pi, err := sc.PaymentIntents.New(intentParams("cus_pi", 700))
			if err != nil {
				t.Fatal(err)
			}
			if pi.Status != stripe.PaymentIntentStatusSucceeded || pi.LatestCharge == nil || pi.AmountReceived != 700 {
				t.Fatalf("intent %+v", pi)
			}
			params := &stripe.ChargeListParams{}
			params.AddExpand("data.payment_intent")
			got := listAll(t, sc.Charges.List(params))
			if len(got) != 1 || got[0].ID != pi.LatestCharge.ID {
				t.Fatalf("charges %v", ids(got))
			}
			ch := got[0]
			if ch.PaymentIntent == nil || ch.PaymentIntent.ID != pi.ID || ch.PaymentIntent.Metadata["billing_period"] != "2024-04" {
				t.Fatalf("expanded intent %+v", ch.PaymentIntent)
			}
			if omit != (ch.Metadata["billing_period"] == "") || omit != (ch.Description == "") {
				t.Fatalf("charge metadata %v description %q", ch.Metadata, ch.Description)
			}
			// Without expand the intent is just an id.
			plain, err := sc.Charges.Get(ch.ID, nil)
			if err != nil || plain.PaymentIntent.ID != pi.ID || plain.PaymentIntent.Metadata != nil {
				t.Fatalf("plain %+v %v", plain.PaymentIntent, err)
			}
			gp := &stripe.ChargeParams{}
			gp.AddExpand("payment_intent")
			exp, err := sc.Charges.Get(ch.ID, gp)
			if err != nil || exp.PaymentIntent.Amount != 700 {
				t.Fatalf("expanded get %+v %v", exp.PaymentIntent, err)
			}
			back, err := sc.PaymentIntents.Get(pi.ID, nil)
			if err != nil || back.LatestCharge.ID != ch.ID || back.Metadata["customer_id"] != "c-cus_pi" {
				t.Fatalf("intent get %+v %v", back, err)
			}
			if srv.SucceededCharges("c-cus_pi", "2024-04") != map[bool]int{false: 1, true: 0}[omit] {
				t.Fatal("SucceededCharges counts charge metadata only")
			}
		})
	}
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	ch, err := sc.Charges.New(newChargeParams("cus_r", 1000, ""))
	if err != nil {
		t.Fatal(err)
	}
	re, err := sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(ch.ID), Amount: stripe.Int64(300),
		Reason: stripe.String("duplicate")})
	if err != nil || re.Amount != 300 || re.Charge.ID != ch.ID || re.Status != "succeeded" {
		t.Fatalf("refund %+v %v", re, err)
	}
	_, err = sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(ch.ID), Amount: stripe.Int64(701)})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Code != stripe.ErrorCodeAmountTooLarge {
		t.Fatalf("code %s", se.Code)
	}
	if _, err := sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(ch.ID)}); err != nil {
		t.Fatal(err)
	}
	_, err = sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(ch.ID)})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Code != stripe.ErrorCodeChargeAlreadyRefunded {
		t.Fatalf("code %s", se.Code)
	}
	got, err := sc.Charges.Get(ch.ID, nil)
	if err != nil || !got.Refunded || got.AmountRefunded != 1000 {
		t.Fatalf("charge after refunds %+v", got)
	}
	it := sc.Refunds.List(&stripe.RefundListParams{Charge: stripe.String(ch.ID)})
	var amounts []int64
	for it.Next() {
		amounts = append(amounts, it.Refund().Amount)
	}
	if it.Err() != nil || len(amounts) != 2 || amounts[0] != 700 || amounts[1] != 300 {
		t.Fatalf("refund list %v %v", amounts, it.Err())
	}
	if srv.SucceededCharges("c-cus_r", "2024-04") != 0 {
		t.Fatal("fully refunded charge still counted")
	}
	// By payment_intent: an intent that never charged has no refunds (not
	// every refund of the account).
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(500), Currency: stripe.String("usd"),
		Customer: stripe.String("cus_r")})
	if err != nil {
		t.Fatal(err)
	}
	it = sc.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String(pi.ID)})
	for it.Next() {
		t.Fatalf("refund %s listed for intent %s, which has no charge", it.Refund().ID, pi.ID)
	}
	if it.Err() != nil {
		t.Fatal(it.Err())
	}
}

func TestRestrictedKeyPermissions(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	if _, err := sc.PaymentIntents.New(intentParams("cus_rk", 100)); err != nil {
		t.Fatal(err)
	}
	const rk = "rk_test_auditor_secret_abcd"
	srv.SetKeyPermissions(rk, "charges_read")
	ro := newClient(t, srv, clientOpts{key: rk})
	if got := listAll(t, ro.Charges.List(&stripe.ChargeListParams{})); len(got) != 1 {
		t.Fatalf("read with rk: %d", len(got))
	}
	_, err := ro.Charges.New(newChargeParams("cus_rk", 100, ""))
	se := stripeErr(t, err, http.StatusForbidden)
	if se.Type != stripe.ErrorTypeInvalidRequest || !strings.Contains(se.Msg, "'rak_charge_write'") ||
		strings.Contains(se.Msg, rk) || !strings.Contains(se.Msg, "abcd") {
		t.Fatalf("403 = %s %q", se.Type, se.Msg)
	}
	params := &stripe.ChargeListParams{}
	params.AddExpand("data.payment_intent")
	it := ro.Charges.List(params)
	it.Next()
	if se := stripeErr(t, it.Err(), http.StatusForbidden); !strings.Contains(se.Msg, "rak_payment_intent_read") {
		t.Fatalf("expand 403 %q", se.Msg)
	}
	srv.SetKeyPermissions(rk, "charges_read", "payment_intents_read")
	if got := listAll(t, ro.Charges.List(params)); got[0].PaymentIntent.Amount != 100 {
		t.Fatal("expand with permission")
	}
	_, err = newClient(t, srv, clientOpts{key: "rk_test_unknown_key"}).Charges.Get("ch_x", nil)
	stripeErr(t, err, http.StatusUnauthorized)
	_, err = newClient(t, srv, clientOpts{key: "pk_test_public"}).Charges.Get("ch_x", nil)
	stripeErr(t, err, http.StatusUnauthorized)
}

func TestDuplicates(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{})
	md := func(c, p string) map[string]string { return map[string]string{"customer_id": c, "billing_period": p} }
	a1 := srv.SeedCharge(ChargeSeed{Customer: "cus_1", Amount: 100, Metadata: md("c1", "2024-04")})
	a2 := srv.SeedCharge(ChargeSeed{Customer: "cus_1", Amount: 100, Metadata: md("c1", "2024-04")})
	srv.SeedCharge(ChargeSeed{Customer: "cus_1", Amount: 100, Metadata: md("c1", "2024-05")})
	// Fully refunded and failed charges are not double charges.
	srv.SeedCharge(ChargeSeed{Customer: "cus_2", Amount: 100, Metadata: md("c2", "2024-04")})
	srv.SeedCharge(ChargeSeed{Customer: "cus_2", Amount: 100, Metadata: md("c2", "2024-04"), AmountRefunded: 100})
	srv.SeedCharge(ChargeSeed{Customer: "cus_2", Amount: 100, Metadata: md("c2", "2024-04"), Status: "failed"})
	// The naive consumer's charges carry only a description.
	n1 := srv.SeedCharge(ChargeSeed{Customer: "cus_3", Amount: 250, Description: "Usage billing for 2024-04"})
	n2 := srv.SeedCharge(ChargeSeed{Customer: "cus_3", Amount: 250, Description: "Usage billing for 2024-04", AmountRefunded: 50})
	srv.SeedCharge(ChargeSeed{Customer: "cus_3", Amount: 250, Description: "something else"})

	got := srv.Duplicates()
	if len(got) != 2 {
		t.Fatalf("groups %+v", got)
	}
	if g := got[0]; g.Customer != "cus_1" || g.Period != "2024-04" || len(g.ChargeIDs) != 2 || g.ChargeIDs[0] != a1.ID || g.ChargeIDs[1] != a2.ID {
		t.Fatalf("group 0 %+v", g)
	}
	if g := got[1]; g.Customer != "cus_3" || g.ChargeIDs[0] != n1.ID || g.ChargeIDs[1] != n2.ID || g.Amounts[1] != 200 {
		t.Fatalf("group 1 %+v", g)
	}
	if srv.SucceededCharges("c1", "2024-04") != 2 || srv.SucceededCharges("c2", "2024-04") != 1 || srv.SucceededCharges("c1", "2024-06") != 0 {
		t.Fatal("SucceededCharges")
	}
}
