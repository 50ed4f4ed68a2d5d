package stripesim

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// Charge is a stored charge as the inspection API reports it.
type Charge struct {
	ID             string
	Customer       string // Stripe customer id
	Amount         int64
	AmountRefunded int64
	Currency       string
	Created        time.Time
	Status         string // "succeeded", "pending" (a bank debit not yet settled) or "failed"
	FailureCode    string // e.g. "card_declined", "account_closed"
	DeclineCode    string // a card decline's decline_code, e.g. "insufficient_funds"
	Refunded       bool   // fully refunded
	Disputed       bool   // a dispute was opened (Dispute)
	Description    string
	Metadata       map[string]string
	PaymentIntent  string
	// IdempotencyKey is the key of the request that created the charge
	// (empty for seeded charges).
	IdempotencyKey string
}

// ChargeSeed describes a charge stored directly, without HTTP: for auditor
// tests and benchmarks that need charges at chosen times.
type ChargeSeed struct {
	Customer       string
	Amount         int64
	Currency       string // defaults to "usd"
	Created        time.Time
	Metadata       map[string]string
	Description    string
	Status         string // defaults to "succeeded"; "pending" seeds an unsettled debit (see Settle)
	AmountRefunded int64
	PaymentIntent  string
	// ViaIntent stores the charge as pelguard's default mode makes it: by a
	// confirmed PaymentIntent that carries the same metadata and
	// description (PaymentIntent is then ignored). Config's
	// ChargeOmitsIntentMetadata applies.
	ViaIntent bool
	// Disputed seeds a charge a customer has disputed (charge.disputed).
	Disputed bool
}

// SeedCharge stores a charge directly and returns it. Seeding in created
// order is O(1) per charge; out-of-order seeds cost one sort at the next list.
func (s *Server) SeedCharge(seed ChargeSeed) Charge {
	created := seed.Created
	if created.IsZero() {
		created = s.Now()
	}
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	id, seq := st.nextID("ch")
	ch := &charge{
		id: id, seq: seq, created: created.Unix(), customer: seed.Customer, amount: seed.Amount,
		amountRefunded: seed.AmountRefunded, currency: cmp.Or(seed.Currency, "usd"),
		description: seed.Description, status: cmp.Or(seed.Status, "succeeded"),
		paymentIntent: seed.PaymentIntent, metadata: maps.Clone(seed.Metadata), disputed: seed.Disputed,
	}
	if ch.status == "failed" {
		ch.failureCode, ch.failureMessage = "card_declined", "Your card was declined."
	}
	if seed.ViaIntent {
		piID, piSeq := st.nextID("pi")
		pi := &intent{
			id: piID, seq: piSeq, created: ch.created, customer: ch.customer, amount: ch.amount,
			currency: ch.currency, description: ch.description, metadata: ch.metadata, status: "succeeded",
		}
		switch ch.status {
		case "failed":
			pi.status = "requires_payment_method"
		case "pending":
			pi.status, pi.debit = "processing", true
		}
		st.intents[piID] = pi
		ch.paymentIntent = piID
		if s.cfg.ChargeOmitsIntentMetadata {
			ch.metadata, ch.description = nil, ""
		}
	}
	st.addCharge(ch)
	return ch.export()
}

func (c *charge) export() Charge {
	return Charge{
		ID: c.id, Customer: c.customer, Amount: c.amount, AmountRefunded: c.amountRefunded,
		Currency: c.currency, Created: time.Unix(c.created, 0).UTC(), Status: c.status,
		FailureCode: c.failureCode, DeclineCode: c.declineCode,
		Refunded: c.status == "succeeded" && c.amountRefunded >= c.amount, Disputed: c.disputed, Description: c.description,
		Metadata: maps.Clone(c.metadata), PaymentIntent: c.paymentIntent, IdempotencyKey: c.idemKey,
	}
}

// Charges returns every stored charge, oldest first (the reverse of list
// order).
func (s *Server) Charges() []Charge {
	st := s.store
	st.rlockSorted(func() []sorter { return []sorter{&st.allCharges} })
	defer st.mu.RUnlock()
	out := make([]Charge, len(st.allCharges.items))
	for i, ch := range st.allCharges.items {
		out[i] = ch.export()
	}
	return out
}

// Charge returns one charge by id.
func (s *Server) Charge(id string) (Charge, bool) {
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	ch := st.charges[id]
	if ch == nil {
		return Charge{}, false
	}
	return ch.export(), true
}

// billable reports a charge that took money and kept it.
func (c *charge) billable() bool {
	return c.status == "succeeded" && c.amountRefunded < c.amount
}

// SucceededCharges counts succeeded, not fully refunded charges whose
// metadata customer_id and billing_period are customerID and period
// (pelguard's own ids, not Stripe's). Zero for a customer billed once is
// a lost charge; more than one is a double charge.
func (s *Server) SucceededCharges(customerID, period string) int {
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	n := 0
	for _, ch := range st.allCharges.items {
		if ch.billable() && ch.metadata["customer_id"] == customerID && ch.metadata["billing_period"] == period {
			n++
		}
	}
	return n
}

// DescriptionPrefix is how the naive consumer describes its charges; for
// charges without billing_period metadata the period is the rest of the
// description.
const DescriptionPrefix = "Usage billing for "

// DuplicateGroup is a double charge: several billable charges for one Stripe
// customer and billing period.
type DuplicateGroup struct {
	Customer  string // Stripe customer id
	Period    string
	ChargeIDs []string // oldest first
	Amounts   []int64  // parallel to ChargeIDs, net of partial refunds
}

// Duplicates returns every (Stripe customer, billing period) with more than
// one succeeded, not fully refunded or pending charge (a pending debit is
// money on its way), sorted by customer then period.
// The period is metadata billing_period or, failing that, parsed from a
// "Usage billing for <period>" description; charges with neither are ignored.
func (s *Server) Duplicates() []DuplicateGroup {
	type gk struct{ customer, period string }
	groups := map[gk]*DuplicateGroup{}
	st := s.store
	st.rlockSorted(func() []sorter { return []sorter{&st.allCharges} })
	for _, ch := range st.allCharges.items {
		if !ch.billable() && ch.status != "pending" {
			continue
		}
		period := ch.metadata["billing_period"]
		if period == "" {
			rest, ok := strings.CutPrefix(ch.description, DescriptionPrefix)
			if !ok {
				continue
			}
			period = strings.TrimSpace(rest)
		}
		k := gk{ch.customer, period}
		g := groups[k]
		if g == nil {
			g = &DuplicateGroup{Customer: ch.customer, Period: period}
			groups[k] = g
		}
		g.ChargeIDs = append(g.ChargeIDs, ch.id)
		g.Amounts = append(g.Amounts, ch.amount-ch.amountRefunded)
	}
	st.mu.RUnlock()
	var out []DuplicateGroup
	for _, g := range groups {
		if len(g.ChargeIDs) > 1 {
			out = append(out, *g)
		}
	}
	slices.SortFunc(out, func(a, b DuplicateGroup) int {
		return cmp.Or(cmp.Compare(a.Customer, b.Customer), cmp.Compare(a.Period, b.Period))
	})
	return out
}

// Requests returns request counts by "METHOD /v1/pattern", e.g.
// "POST /v1/charges" or "GET /v1/charges/{id}". Every request that reached
// the emulator counts, including ones later refused or faulted.
func (s *Server) Requests() map[string]int64 {
	s.countsMu.Lock()
	defer s.countsMu.Unlock()
	return maps.Clone(s.counts)
}

// ChargeCreates counts charges created over HTTP (including declined ones,
// excluding idempotent replays and seeds).
func (s *Server) ChargeCreates() int64 { return s.chargeCreates.Load() }
