package stripesim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// ErrNotPending is Settle's answer for a charge that is already final.
var ErrNotPending = errors.New("stripesim: charge is not pending")

// Settle is the bank's answer to a pending debit, days later: id is the
// charge or its PaymentIntent. Succeeded makes the charge "succeeded" and
// the intent "succeeded". Otherwise the charge becomes "failed" with
// failureCode (insufficient_funds when empty; see DebitFailureCodes) and
// the intent goes back to "requires_payment_method" with
// last_payment_error, as Stripe does for ACH and SEPA: the intent can be
// confirmed again, the charge never. The matching events are emitted.
//
// last_payment_error's type for a failed debit is not documented by
// Stripe; we send invalid_request_error with code set to the failure code,
// so receivers must branch on the code, which is what Stripe documents.
func (s *Server) Settle(id string, succeeded bool, failureCode string) error {
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	chID := id
	if pi := st.intents[id]; pi != nil {
		chID = pi.latestCharge
	}
	ch := st.charges[chID]
	if ch == nil {
		return fmt.Errorf("settling %s: %w", id, ErrNoSuchCharge)
	}
	if ch.status != "pending" {
		return fmt.Errorf("settling %s: charge %s is %s: %w", id, ch.id, ch.status, ErrNotPending)
	}
	pi := st.intents[ch.paymentIntent]
	if succeeded {
		ch.status = "succeeded"
		if pi != nil {
			pi.status = "succeeded"
		}
	} else {
		code := cmp.Or(failureCode, "insufficient_funds")
		ch.status, ch.failureCode, ch.failureMessage = "failed", code, debitFailureMessage(code)
		if pi != nil {
			pi.status = "requires_payment_method"
			pi.lastError = &stripeError{Type: "invalid_request_error", Code: code, Message: ch.failureMessage, Charge: ch.id}
		}
	}
	s.emitOutcome(ch, pi, nil)
	return nil
}

// serveSettle answers POST /_sim/settle
// {"id": "pi_…|ch_…", "succeeded": true, "failure_code": "…"}.
func (s *Server) serveSettle(r *http.Request) (int, any) {
	var body struct {
		ID          string `json:"id"`
		Succeeded   bool   `json:"succeeded"`
		FailureCode string `json:"failure_code"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return http.StatusBadRequest, map[string]string{"error": "decoding settle: " + err.Error()}
	}
	err := s.Settle(body.ID, body.Succeeded, body.FailureCode)
	switch {
	case errors.Is(err, ErrNoSuchCharge):
		return http.StatusNotFound, map[string]string{"error": err.Error()}
	case err != nil:
		return http.StatusConflict, map[string]string{"error": err.Error()}
	}
	ch, _ := s.Charge(body.ID)
	if pi := s.intentCharge(body.ID); pi != "" {
		ch, _ = s.Charge(pi)
	}
	return http.StatusOK, map[string]string{"charge": ch.ID, "status": ch.Status}
}

// intentCharge is the latest charge of intent id, "" when id is no intent.
func (s *Server) intentCharge(id string) string {
	s.store.mu.RLock()
	defer s.store.mu.RUnlock()
	if pi := s.store.intents[id]; pi != nil {
		return pi.latestCharge
	}
	return ""
}

// serveEvents answers GET /_sim/events and POST /_sim/events/deliver
// {"ids": ["evt_…", …]}; ok is false for other paths.
func (s *Server) serveEvents(r *http.Request) (status int, v any, ok bool) {
	switch r.Method + " " + r.URL.Path {
	case "GET /_sim/events":
		type ev struct {
			ID         string          `json:"id"`
			Type       string          `json:"type"`
			Object     string          `json:"object_id"`
			Payload    json.RawMessage `json:"payload"`
			Deliveries []Delivery      `json:"deliveries"`
		}
		var out []ev
		for _, e := range s.Events() {
			out = append(out, ev{e.ID, e.Type, e.ObjectID, e.Payload, e.Deliveries})
		}
		return http.StatusOK, out, true
	case "POST /_sim/events/deliver":
		var body struct {
			IDs []string `json:"ids"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			return http.StatusBadRequest, map[string]string{"error": "decoding deliver: " + err.Error()}, true
		}
		ds, err := s.DeliverEvents(r.Context(), body.IDs...)
		if err != nil {
			return http.StatusNotFound, map[string]string{"error": err.Error()}, true
		}
		return http.StatusOK, ds, true
	case "POST /_sim/settle":
		status, v := s.serveSettle(r)
		return status, v, true
	}
	return 0, nil, false
}
