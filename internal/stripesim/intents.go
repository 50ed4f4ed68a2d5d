package stripesim

import (
	"cmp"
	"net/http"
)

// createIntent serves POST /v1/payment_intents. Without confirm it only
// records the intent; there is no separate confirm endpoint. With
// confirm=true (pelguard sends off_session=true too) the outcome comes from
// the faults for the customer or payment method:
//
//   - a card that pays: a succeeded intent and its succeeded charge;
//   - a bank debit (DebitCustomers): 200, the intent "processing" and its
//     charge "pending" until Settle;
//   - a decline (DeclineCustomers, DeclineCodes): 402 card_error
//     card_declined with the decline_code, a failed charge, and the intent
//     back in "requires_payment_method" with last_payment_error;
//   - authentication required (AuthRequiredCustomers): see below;
//   - no payment method (NoPaymentMethodCustomers, no payment_method
//     param): 400 payment_intent_unexpected_state, the intent left
//     "requires_payment_method", no charge.
//
// Authentication required follows Stripe's documented off-session
// behaviour ("Save a card and charge it later": when a payment attempt
// fails, the request fails with a 402 and the PaymentIntent's status is
// requires_payment_method; the error code is authentication_required).
// With off_session=true the issuer declines the charge for want of 3-D
// Secure, so we store a failed charge (outcome.reason
// authentication_required, as Stripe lists it among its decline codes) and
// answer that 402. Without off_session the customer could authenticate, so
// Stripe answers 200 with status "requires_action" and a next_action, and
// no charge exists yet; that is what an integration that forgot
// off_session=true sees.
func (s *Server) createIntent(c *apiCall) response {
	if c.form.expands("latest_charge") {
		// As on Stripe, expanding an object needs read access to it.
		if resp, ok := c.require("charges_read"); !ok {
			return resp
		}
	}
	p, resp, ok := s.parseChargeParams(c)
	if !ok {
		return resp
	}
	confirm := c.form.boolParam("confirm")
	oc := s.faults.current().outcomeFor(p.customer, p.paymentMethod)
	now := s.Now().Unix()
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	id, seq := st.nextID("pi")
	pi := &intent{
		id: id, seq: seq, created: now, customer: p.customer, amount: p.amount, currency: p.currency,
		description: p.description, paymentMethod: p.paymentMethod, metadata: p.metadata,
		livemode: c.livemode, status: "requires_payment_method", debit: oc.kind == outPending,
	}
	if p.paymentMethod != "" {
		pi.status = "requires_confirmation"
	}
	st.intents[pi.id] = pi
	if !confirm {
		return jsonResp(pi.json())
	}
	switch {
	case oc.kind == outNoPaymentMethod:
		pi.status = "requires_payment_method"
		resp := errorResp(http.StatusBadRequest, stripeError{
			Type: "invalid_request_error", Code: "payment_intent_unexpected_state", Param: "payment_method",
			Message: "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the " +
				"PaymentIntent with " + p.customer + ", specify a payment method attached to this customer along with the customer ID.",
			PaymentIntent: pi.json(),
		})
		resp.cache = true // it executed: the same key replays it
		return resp
	case oc.kind == outAuthRequired && !c.form.boolParam("off_session"):
		pi.status = "requires_action"
		pi.nextAction = &nextActionJSON{Type: "use_stripe_sdk", UseStripeSDK: map[string]any{"type": "three_d_secure_redirect"}}
		s.emit("payment_intent.requires_action", pi.id, pi.json(), pi.livemode, c)
		return jsonResp(pi.json())
	}
	chID, chSeq := st.nextID("ch")
	ch := &charge{
		id: chID, seq: chSeq, created: now, customer: p.customer, amount: p.amount, currency: p.currency,
		description: p.description, status: "succeeded", paymentIntent: pi.id,
		paymentMethod: p.paymentMethod, metadata: p.metadata, livemode: c.livemode, idemKey: c.idemKey,
	}
	if s.cfg.ChargeOmitsIntentMetadata {
		// Real Stripe copies both; omitting them lets the auditor's
		// expand[]=data.payment_intent fallback be tested.
		ch.metadata, ch.description = nil, ""
	}
	switch oc.kind {
	case outPending:
		ch.status, pi.status = "pending", "processing"
	case outDeclined, outAuthRequired:
		ch.decline(oc)
		pi.status = "requires_payment_method"
		e := oc.cardError(ch.id)
		pi.lastError = &e
	default:
		pi.status = "succeeded"
	}
	st.addCharge(ch)
	s.emitOutcome(ch, pi, c)
	out := pi.json()
	if c.form.expands("latest_charge") {
		// Stripe honours expand on create too; without it every charge
		// would cost the client a second request.
		out.LatestCharge = ch.json()
	}
	s.chargeCreates.Add(1)
	if ch.status == "failed" {
		return declinedErr(oc, ch.id, out)
	}
	resp = jsonResp(out)
	resp.createdCharge = true
	return resp
}

// decline marks a new charge failed as oc says: failure_code is the
// error's code (card_declined, authentication_required, processing_error,
// …), outcome.reason the decline_code when there is one.
func (ch *charge) decline(oc outcome) {
	ch.status, ch.failureCode, ch.declineCode, ch.adviceCode = "failed", oc.errCode, oc.declineCode, oc.adviceCode
	ch.failureMessage = declineMessage(cmp.Or(oc.declineCode, oc.errCode))
}

// emitOutcome records the events of a charge reaching its status and, when
// pi is not nil, of its intent following; callers hold the store lock.
func (s *Server) emitOutcome(ch *charge, pi *intent, c *apiCall) {
	chType, piType := "charge.succeeded", "payment_intent.succeeded"
	switch ch.status {
	case "pending":
		chType, piType = "charge.pending", "payment_intent.processing"
	case "failed":
		chType, piType = "charge.failed", "payment_intent.payment_failed"
	}
	s.emit(chType, ch.id, ch.json(), ch.livemode, c)
	if pi != nil {
		s.emit(piType, pi.id, pi.json(), pi.livemode, c)
	}
}

// getIntent serves GET /v1/payment_intents/{id}; expand[]=latest_charge
// embeds the charge.
func (s *Server) getIntent(c *apiCall) response {
	expandCharge := c.form.expands("latest_charge")
	if expandCharge {
		if resp, ok := c.require("charges_read"); !ok {
			return resp
		}
	}
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	pi := st.intents[c.id]
	if pi == nil {
		return missing("payment_intent", "intent", c.id)
	}
	out := pi.json()
	if ch := st.charges[pi.latestCharge]; expandCharge && ch != nil {
		out.LatestCharge = ch.json()
	}
	return jsonResp(out)
}

// cancelIntent serves POST /v1/payment_intents/{id}/cancel. As on Stripe, an
// intent can be canceled while it waits for a payment method, a
// confirmation or an action; a succeeded, processing or canceled one is
// answered 400 payment_intent_unexpected_state with the intent in the
// error. Canceling emits payment_intent.canceled.
func (s *Server) cancelIntent(c *apiCall) response {
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	pi := st.intents[c.id]
	if pi == nil {
		return missing("payment_intent", "intent", c.id)
	}
	switch pi.status {
	case "requires_payment_method", "requires_confirmation", "requires_action", "requires_capture":
	default:
		resp := errorResp(http.StatusBadRequest, stripeError{
			Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
			Message: "You cannot cancel this PaymentIntent because it has a status of " + pi.status +
				". Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing.",
			PaymentIntent: pi.json(),
		})
		resp.cache = true
		return resp
	}
	pi.status, pi.nextAction = "canceled", nil
	s.emit("payment_intent.canceled", pi.id, pi.json(), pi.livemode, c)
	return jsonResp(pi.json())
}
