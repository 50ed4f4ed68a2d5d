package stripesim

import (
	"maps"
	"net/http"
	"strings"
)

// chargeParams are the validated parameters shared by POST /v1/charges and
// confirmed POST /v1/payment_intents.
type chargeParams struct {
	amount        int64
	currency      string
	customer      string
	description   string
	paymentMethod string
	metadata      map[string]string
}

func (s *Server) parseChargeParams(c *apiCall) (chargeParams, response, bool) {
	var p chargeParams
	amount, ok, resp := c.form.int64Param("amount")
	if resp.status != 0 {
		return p, resp, false
	}
	if !ok {
		return p, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error",
			Code: "parameter_missing", Param: "amount", Message: "Missing required param: amount."}), false
	}
	if amount < 1 {
		return p, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error",
			Code: "amount_too_small", Param: "amount", Message: "This value must be greater than or equal to 1."}), false
	}
	p.amount = amount
	p.currency = strings.ToLower(c.form.get("currency"))
	if len(p.currency) != 3 {
		return p, errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error",
			Code: "parameter_missing", Param: "currency", Message: "Missing required param: currency."}), false
	}
	p.customer = c.form.get("customer")
	if p.customer != "" && s.cfg.RequireCustomers {
		s.store.mu.RLock()
		_, known := s.store.customers[p.customer]
		s.store.mu.RUnlock()
		if !known {
			resp := missing("customer", "customer", p.customer)
			resp.status = http.StatusBadRequest
			return p, resp, false
		}
	}
	p.description = c.form.get("description")
	p.paymentMethod = c.form.get("payment_method")
	md, resp, ok := metadataParam(c.form)
	if !ok {
		return p, resp, false
	}
	p.metadata = md
	return p, response{}, true
}

// createCharge serves POST /v1/charges. The faults decide as for a
// confirmed PaymentIntent: a succeeded charge, a pending one for a bank
// debit, a 402 decline with its decline_code (authentication required is
// a decline too: the Charges API cannot do 3-D Secure), or, for a customer
// without a payment method, Stripe's 400 "no active card".
func (s *Server) createCharge(c *apiCall) response {
	p, resp, ok := s.parseChargeParams(c)
	if !ok {
		return resp
	}
	oc := s.faults.current().outcomeFor(p.customer, p.paymentMethod)
	if oc.kind == outNoPaymentMethod {
		resp := errorResp(http.StatusBadRequest, stripeError{Type: "invalid_request_error", Code: "missing",
			Param: "card", Message: "Cannot charge a customer that has no active card"})
		resp.cache = true
		return resp
	}
	now := s.Now().Unix()
	st := s.store
	st.mu.Lock()
	id, seq := st.nextID("ch")
	ch := &charge{
		id: id, seq: seq, created: now, customer: p.customer, amount: p.amount, currency: p.currency,
		description: p.description, status: "succeeded", paymentMethod: p.paymentMethod,
		metadata: p.metadata, livemode: c.livemode, idemKey: c.idemKey,
	}
	switch oc.kind {
	case outPending:
		ch.status = "pending"
	case outDeclined, outAuthRequired:
		ch.decline(oc)
	}
	st.addCharge(ch)
	s.emitOutcome(ch, nil, c)
	out := ch.json()
	st.mu.Unlock()
	s.chargeCreates.Add(1)
	if ch.status == "failed" {
		return declinedErr(oc, ch.id, nil)
	}
	resp = jsonResp(out)
	resp.createdCharge = true
	return resp
}

func (s *Server) getCharge(c *apiCall) response {
	expandPI := c.form.expands("payment_intent")
	if expandPI {
		if resp, ok := c.require("payment_intents_read"); !ok {
			return resp
		}
	}
	st := s.store
	st.mu.RLock()
	ch := st.charges[c.id]
	if ch == nil {
		st.mu.RUnlock()
		return missing("charge", "id", c.id)
	}
	out := ch.json()
	if expandPI {
		st.expandIntent(&out)
	}
	st.mu.RUnlock()
	return jsonResp(out)
}

// expandIntent embeds the charge's PaymentIntent; callers hold the lock.
func (st *store) expandIntent(out *chargeJSON) {
	if id, ok := out.PaymentIntent.(string); ok {
		if p := st.intents[id]; p != nil {
			out.PaymentIntent = p.json()
		}
	}
}

// updateCharge supports metadata and description updates (POST
// /v1/charges/{id}); an empty metadata value deletes the key, as in Stripe.
func (s *Server) updateCharge(c *apiCall) response {
	md, resp, ok := metadataParam(c.form)
	if !ok {
		return resp
	}
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	ch := st.charges[c.id]
	if ch == nil {
		return missing("charge", "id", c.id)
	}
	if len(md) > 0 {
		next := maps.Clone(ch.metadata)
		if next == nil {
			next = map[string]string{}
		}
		for k, v := range md {
			if v == "" {
				delete(next, k)
			} else {
				next[k] = v
			}
		}
		ch.metadata = next
	}
	if c.form.has("description") {
		ch.description = c.form.get("description")
	}
	return jsonResp(ch.json())
}

// listCharges serves GET /v1/charges with customer, payment_intent and
// created filters, cursors and expand[]=data.payment_intent. Cost per page
// is O(log n + limit) whatever the number of stored charges.
func (s *Server) listCharges(c *apiCall) response {
	q, resp, ok := parseListQuery(c.form)
	if !ok {
		return resp
	}
	expandPI := c.form.expands("data.payment_intent")
	if expandPI {
		if resp, ok := c.require("payment_intents_read"); !ok {
			return resp
		}
	}
	customerID, intentID := c.form.get("customer"), c.form.get("payment_intent")
	st := s.store
	return listPage(st, q, listResource[*charge]{
		object: "charge", url: "/v1/charges",
		pick: func() *index[*charge] {
			switch {
			case intentID != "":
				if p := st.intents[intentID]; p != nil {
					return &p.charges
				}
				return nil
			case customerID != "":
				return st.byCustomer[customerID]
			}
			return &st.allCharges
		},
		lookup: func(id string) (*charge, bool) { ch, ok := st.charges[id]; return ch, ok },
		render: func(ch *charge) any {
			out := ch.json()
			if expandPI {
				st.expandIntent(&out)
			}
			return out
		},
	})
}
