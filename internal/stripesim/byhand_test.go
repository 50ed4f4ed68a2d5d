package stripesim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stripe/stripe-go/v76"
)

func postAdmin(t *testing.T, srv *Server, path string, body any) (int, map[string]string) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(srv.URL()+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// A refund made in the Dashboard shows on the charge as stripe-go reads it:
// amount_refunded, then refunded once nothing is left.
func TestRefundByHandShowsOnTheCharge(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	ch, err := sc.Charges.New(newChargeParams("cus_hand", 2500, "k-hand"))
	if err != nil {
		t.Fatal(err)
	}
	if status, out := postAdmin(t, srv, "/_sim/refund", map[string]any{"charge": ch.ID, "amount": 1000}); status != http.StatusOK || out["id"] == "" {
		t.Fatalf("partial refund by hand: %d %v", status, out)
	}
	got, err := sc.Charges.Get(ch.ID, nil)
	if err != nil || got.AmountRefunded != 1000 || got.Refunded {
		t.Fatalf("after a partial refund: refunded %d (%v) %v", got.AmountRefunded, got.Refunded, err)
	}
	if _, err := srv.RefundByHand(ch.ID, 0); err != nil { // the rest
		t.Fatal(err)
	}
	got, err = sc.Charges.Get(ch.ID, nil)
	if err != nil || got.AmountRefunded != 2500 || !got.Refunded {
		t.Fatalf("after the rest: refunded %d (%v) %v", got.AmountRefunded, got.Refunded, err)
	}
	if _, err := srv.RefundByHand(ch.ID, 0); err == nil {
		t.Fatal("a fully refunded charge was refunded again")
	}
	if status, _ := postAdmin(t, srv, "/_sim/refund", map[string]any{"charge": "ch_nope"}); status != http.StatusNotFound {
		t.Fatalf("unknown charge: %d", status)
	}
	rs := srv.Requests()["POST /v1/refunds"]
	if rs != 0 {
		t.Fatalf("by-hand refunds went through the API: %d", rs)
	}
}

// A dispute sets charge.disputed (stripe.Charge.Disputed), is listed, and
// blocks refunds as Stripe does (charge_disputed).
func TestDisputeMarksTheChargeAndBlocksRefunds(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	ch, err := sc.Charges.New(newChargeParams("cus_disp", 2500, "k-disp"))
	if err != nil {
		t.Fatal(err)
	}
	status, out := postAdmin(t, srv, "/_sim/dispute", map[string]any{"charge": ch.ID})
	if status != http.StatusOK || out["id"] == "" {
		t.Fatalf("dispute: %d %v", status, out)
	}
	got, err := sc.Charges.Get(ch.ID, nil)
	if err != nil || !got.Disputed {
		t.Fatalf("charge.disputed = %v (%v)", got.Disputed, err)
	}
	it := sc.Charges.List(&stripe.ChargeListParams{})
	for it.Next() {
		if c := it.Charge(); c.ID == ch.ID && !c.Disputed {
			t.Fatal("the listing lacks disputed")
		}
	}
	if ds := srv.Disputes(); len(ds) != 1 || ds[0].Charge != ch.ID || ds[0].Amount != 2500 || ds[0].ID != out["id"] {
		t.Fatalf("disputes %+v", ds)
	}
	_, err = sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(ch.ID)})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Code != "charge_disputed" {
		t.Fatalf("refund of a disputed charge: %s", se.Code)
	}
}

// FailNextRefunds: the first refund POST fails with 500 before executing
// (nothing refunded); the retry with the same key refunds once.
func TestFailNextRefunds(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{Faults: Faults{FailNextRefunds: 1}})
	ch, err := sc.Charges.New(newChargeParams("cus_fail", 2500, "k-fail"))
	if err != nil {
		t.Fatal(err)
	}
	p := &stripe.RefundParams{Charge: stripe.String(ch.ID)}
	p.SetIdempotencyKey("refund-" + ch.ID)
	_, err = sc.Refunds.New(p)
	stripeErr(t, err, http.StatusInternalServerError)
	if c, _ := srv.Charge(ch.ID); c.AmountRefunded != 0 || srv.Faults().FailNextRefunds != 0 {
		t.Fatalf("after the fault: refunded %d, %d faults left", c.AmountRefunded, srv.Faults().FailNextRefunds)
	}
	p = &stripe.RefundParams{Charge: stripe.String(ch.ID)}
	p.SetIdempotencyKey("refund-" + ch.ID)
	if _, err := sc.Refunds.New(p); err != nil {
		t.Fatal(err)
	}
	if c, _ := srv.Charge(ch.ID); c.AmountRefunded != 2500 {
		t.Fatalf("refunded %d", c.AmountRefunded)
	}
}
