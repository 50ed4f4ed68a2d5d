package stripesim

import (
	"fmt"
	"net/http"
)

// createRefund serves POST /v1/refunds (charge or payment_intent, amount
// defaulting to what is left, reason, metadata) and refuses, like Stripe,
// refunds of failed charges, of fully refunded charges and beyond the
// unrefunded amount.
func (s *Server) createRefund(c *apiCall) response {
	chargeID, intentID := c.form.get("charge"), c.form.get("payment_intent")
	if chargeID == "" && intentID == "" {
		return errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "parameter_missing",
			Param: "charge", Message: "One of the following params should be provided for this request: charge or payment_intent."})
	}
	amount, hasAmount, resp := c.form.int64Param("amount")
	if resp.status != 0 {
		return resp
	}
	if hasAmount && amount < 1 {
		return errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "amount_too_small",
			Param: "amount", Message: "This value must be greater than or equal to 1."})
	}
	md, resp, ok := metadataParam(c.form)
	if !ok {
		return resp
	}
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	if chargeID == "" {
		pi := st.intents[intentID]
		if pi == nil {
			resp := missing("payment_intent", "payment_intent", intentID)
			resp.status = http.StatusBadRequest
			return resp
		}
		chargeID = pi.latestCharge
	}
	ch := st.charges[chargeID]
	if ch == nil {
		resp := missing("charge", "charge", chargeID)
		resp.status = http.StatusBadRequest
		return resp
	}
	re, resp := s.refundLocked(ch, amount, hasAmount, c.form.get("reason"), md)
	if resp.status != 0 {
		return resp
	}
	return jsonResp(re.json())
}

// refundLocked refunds amount (all that is left when !hasAmount) of ch,
// refusing what Stripe refuses; callers hold the write lock.
func (s *Server) refundLocked(ch *charge, amount int64, hasAmount bool, reason string, md map[string]string) (*refund, response) {
	st := s.store
	if ch.status != "succeeded" {
		return nil, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "charge_not_refundable",
			Param: "charge", Message: fmt.Sprintf("Charge %s has failed and cannot be refunded.", ch.id)})
	}
	if ch.disputed {
		return nil, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "charge_disputed",
			Param: "charge", Message: fmt.Sprintf("Charge %s has been charged back; cannot issue a refund.", ch.id)})
	}
	left := ch.amount - ch.amountRefunded
	if left <= 0 {
		return nil, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "charge_already_refunded",
			Param: "charge", Message: fmt.Sprintf("Charge %s has already been refunded.", ch.id)})
	}
	if !hasAmount {
		amount = left
	}
	if amount > left {
		return nil, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "amount_too_large",
			Param: "amount", Message: fmt.Sprintf("Refund amount (%d) is greater than unrefunded amount on charge (%d)", amount, left)})
	}
	id, seq := st.nextID("re")
	re := &refund{
		id: id, seq: seq, created: s.Now().Unix(), amount: amount, charge: ch.id, currency: ch.currency,
		paymentIntent: ch.paymentIntent, reason: reason, metadata: md,
	}
	st.refunds[re.id] = re
	st.allRefunds.add(re)
	ch.refunds.add(re)
	ch.amountRefunded += amount
	s.emit("charge.refunded", ch.id, ch.json(), ch.livemode, nil)
	return re, response{}
}

func (s *Server) getRefund(c *apiCall) response {
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	re := st.refunds[c.id]
	if re == nil {
		return missing("refund", "id", c.id)
	}
	return jsonResp(re.json())
}

// listRefunds serves GET /v1/refunds, optionally for one charge or intent.
func (s *Server) listRefunds(c *apiCall) response {
	q, resp, ok := parseListQuery(c.form)
	if !ok {
		return resp
	}
	chargeID, intentID := c.form.get("charge"), c.form.get("payment_intent")
	st := s.store
	return listPage(st, q, listResource[*refund]{
		object: "refund", url: "/v1/refunds",
		pick: func() *index[*refund] {
			if intentID != "" {
				pi := st.intents[intentID]
				if pi == nil || pi.latestCharge == "" {
					return nil // no such intent, or one that never charged
				}
				chargeID = pi.latestCharge
			}
			if chargeID != "" {
				if ch := st.charges[chargeID]; ch != nil {
					return &ch.refunds
				}
				return nil
			}
			return &st.allRefunds
		},
		lookup: func(id string) (*refund, bool) { re, ok := st.refunds[id]; return re, ok },
		render: func(re *refund) any { return re.json() },
	})
}
