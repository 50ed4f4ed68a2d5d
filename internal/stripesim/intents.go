package stripesim

// createIntent serves POST /v1/payment_intents. With confirm=true (pelguard
// sends off_session=true too) it settles at once, as an off-session card
// payment does: a succeeded intent and its charge, or on a decline an intent
// back in requires_payment_method, a failed charge and a 402. Without
// confirm it only records the intent; there is no separate confirm endpoint.
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
	f := s.faults.current()
	now := s.Now().Unix()
	st := s.store
	st.mu.Lock()
	id, seq := st.nextID("pi")
	pi := &intent{
		id: id, seq: seq, created: now, customer: p.customer, amount: p.amount, currency: p.currency,
		description: p.description, paymentMethod: p.paymentMethod, metadata: p.metadata,
		livemode: c.livemode, status: "requires_payment_method",
	}
	if p.paymentMethod != "" {
		pi.status = "requires_confirmation"
	}
	st.intents[pi.id] = pi
	if !confirm {
		out := pi.json()
		st.mu.Unlock()
		return jsonResp(out)
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
	if f.declines[p.customer] {
		ch.status, ch.failureCode, ch.failureMessage = "failed", "card_declined", "Your card was declined."
		pi.status = "requires_payment_method"
	} else {
		pi.status = "succeeded"
	}
	st.addCharge(ch)
	out := pi.json()
	if c.form.expands("latest_charge") {
		// Stripe honours expand on create too; without it every charge
		// would cost the client a second request.
		out.LatestCharge = ch.json()
	}
	st.mu.Unlock()
	s.chargeCreates.Add(1)
	if ch.status == "failed" {
		return declined(ch.id, out)
	}
	resp = jsonResp(out)
	resp.createdCharge = true
	return resp
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
