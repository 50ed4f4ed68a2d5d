package stripesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// What an operator does in the Dashboard, and what a cardholder's bank does,
// happens behind pelguard's back: these admin calls let tests and the drill
// change a charge the way Stripe would, without pelguard's key or an
// idempotency key.

// dispute is a Stripe dispute (chargeback) opened on a charge.
type dispute struct {
	id      string
	seq     uint64
	created int64
	charge  string
	amount  int64
	reason  string
}

// Dispute is a stored dispute as the inspection API reports it.
type Dispute struct {
	ID     string `json:"id"`
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
	Reason string `json:"reason"`
	Status string `json:"status"`
}

// ErrNoSuchCharge is RefundByHand's and Dispute's answer for an unknown
// charge id.
var ErrNoSuchCharge = errors.New("stripesim: no such charge")

// RefundByHand refunds amount of a charge (0: all that is left) as a
// Dashboard user would: no idempotency key, reason requested_by_customer.
// Stripe's refusals (a failed, fully refunded or disputed charge, an amount
// above what is left) are errors.
func (s *Server) RefundByHand(chargeID string, amount int64) (string, error) {
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	ch := st.charges[chargeID]
	if ch == nil {
		return "", fmt.Errorf("refunding %s by hand: %w", chargeID, ErrNoSuchCharge)
	}
	re, resp := s.refundLocked(ch, amount, amount > 0, "requested_by_customer", map[string]string{})
	if resp.status != 0 {
		return "", fmt.Errorf("refunding %s by hand: %s", chargeID, resp.body)
	}
	return re.id, nil
}

// Dispute opens a dispute (reason "fraudulent", status needs_response) for
// the whole amount of a succeeded charge and sets its disputed flag, as a
// cardholder's bank does. It returns the dispute id.
func (s *Server) Dispute(chargeID string) (string, error) {
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	ch := st.charges[chargeID]
	if ch == nil {
		return "", fmt.Errorf("disputing %s: %w", chargeID, ErrNoSuchCharge)
	}
	if ch.status != "succeeded" {
		return "", fmt.Errorf("disputing %s: a %s charge cannot be disputed", chargeID, ch.status)
	}
	id, seq := st.nextID("dp")
	dp := &dispute{id: id, seq: seq, created: s.Now().Unix(), charge: ch.id, amount: ch.amount, reason: "fraudulent"}
	st.disputes[id] = dp
	ch.disputed = true
	s.emit("charge.dispute.created", dp.id, dp.json(ch), ch.livemode, nil)
	return id, nil
}

// Disputes returns every dispute, in no particular order.
func (s *Server) Disputes() []Dispute {
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	out := make([]Dispute, 0, len(st.disputes))
	for _, d := range st.disputes {
		out = append(out, Dispute{ID: d.id, Charge: d.charge, Amount: d.amount, Reason: d.reason, Status: "needs_response"})
	}
	return out
}

// serveByHand answers POST /_sim/refund {"charge": "ch_…", "amount": 0}
// and POST /_sim/dispute {"charge": "ch_…"}; ok is false for other paths.
func (s *Server) serveByHand(r *http.Request) (status int, v any, ok bool) {
	if r.Method != http.MethodPost || (r.URL.Path != "/_sim/refund" && r.URL.Path != "/_sim/dispute") {
		return 0, nil, false
	}
	var body struct {
		Charge string `json:"charge"`
		Amount int64  `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return http.StatusBadRequest, map[string]string{"error": "decoding body: " + err.Error()}, true
	}
	var id string
	var err error
	if r.URL.Path == "/_sim/refund" {
		id, err = s.RefundByHand(body.Charge, body.Amount)
	} else {
		id, err = s.Dispute(body.Charge)
	}
	switch {
	case errors.Is(err, ErrNoSuchCharge):
		return http.StatusNotFound, map[string]string{"error": err.Error()}, true
	case err != nil:
		return http.StatusBadRequest, map[string]string{"error": err.Error()}, true
	}
	return http.StatusOK, map[string]string{"id": id}, true
}

type disputeJSON struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	Charge             string            `json:"charge"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	IsChargeRefundable bool              `json:"is_charge_refundable"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentIntent      *string           `json:"payment_intent"`
	Reason             string            `json:"reason"`
	Status             string            `json:"status"`
}

func (d *dispute) json(ch *charge) disputeJSON {
	return disputeJSON{
		ID: d.id, Object: "dispute", Amount: d.amount, Charge: d.charge, Created: d.created,
		Currency: ch.currency, Livemode: ch.livemode, Metadata: map[string]string{},
		PaymentIntent: nilIfEmpty(ch.paymentIntent), Reason: d.reason, Status: "needs_response",
	}
}
