package stripesim

import (
	"cmp"
	"fmt"
	"sync"
)

// store holds every object. One RWMutex guards it: a charge create holds the
// write lock for a map insert and an append (well under a microsecond), and
// list pages hold the read lock for two binary searches and a copy, so HTTP
// and JSON, done outside the lock, dominate. Objects are mutated only under
// the write lock, and handlers render snapshots taken under the lock.
type store struct {
	mu  sync.RWMutex
	seq uint64

	customers  map[string]*customer
	charges    map[string]*charge
	allCharges index[*charge]
	byCustomer map[string]*index[*charge]
	intents    map[string]*intent
	refunds    map[string]*refund
	allRefunds index[*refund]
	disputes   map[string]*dispute
}

func newStore() *store {
	return &store{
		customers:  make(map[string]*customer),
		charges:    make(map[string]*charge),
		byCustomer: make(map[string]*index[*charge]),
		intents:    make(map[string]*intent),
		refunds:    make(map[string]*refund),
		disputes:   make(map[string]*dispute),
	}
}

// drop forgets every stored object (ids keep counting up).
func (st *store) drop() {
	st.mu.Lock()
	defer st.mu.Unlock()
	fresh := newStore()
	st.customers, st.charges, st.byCustomer = fresh.customers, fresh.charges, fresh.byCustomer
	st.intents, st.refunds, st.disputes = fresh.intents, fresh.refunds, fresh.disputes
	st.allCharges, st.allRefunds = index[*charge]{}, index[*refund]{}
}

// nextID returns a unique, sortable id such as ch_sim000000000042; callers
// hold the write lock.
func (st *store) nextID(prefix string) (string, uint64) {
	st.seq++
	return fmt.Sprintf("%s_sim%012d", prefix, st.seq), st.seq
}

type customer struct {
	id          string
	created     int64
	email       string
	name        string
	description string
	metadata    map[string]string
	livemode    bool
}

type charge struct {
	id             string
	seq            uint64
	created        int64
	customer       string
	amount         int64
	amountRefunded int64
	currency       string
	description    string
	status         string // succeeded | pending | failed
	failureCode    string
	// declineCode is a card decline's decline_code, rendered as
	// outcome.reason; empty for debits, whose failureCode says it all.
	declineCode    string
	adviceCode     string // the issuer's advice, outcome.advice_code
	failureMessage string
	paymentIntent  string
	paymentMethod  string
	metadata       map[string]string // replaced, never mutated in place
	livemode       bool
	idemKey        string
	refunds        index[*refund]
	// disputed is Stripe's charge.disputed: a dispute was opened on it
	// (Dispute). Stripe keeps the flag whatever the dispute's outcome.
	disputed bool
}

func (c *charge) sortKey() sortKey { return sortKey{c.created, c.seq} }

type intent struct {
	id            string
	seq           uint64
	created       int64
	customer      string
	amount        int64
	currency      string
	description   string
	status        string
	paymentMethod string
	metadata      map[string]string
	livemode      bool
	latestCharge  string
	charges       index[*charge]
	// debit marks an intent paid by bank debit (payment_method_types
	// us_bank_account): it goes through "processing" before it is final.
	debit bool
	// lastError is Stripe's last_payment_error: why the last attempt failed.
	lastError *stripeError
	// nextAction is set while status is "requires_action".
	nextAction *nextActionJSON
}

// nextActionJSON is the next_action of an intent waiting for the customer.
type nextActionJSON struct {
	Type         string         `json:"type"`
	UseStripeSDK map[string]any `json:"use_stripe_sdk,omitempty"`
}

func (p *intent) sortKey() sortKey { return sortKey{p.created, p.seq} }

type refund struct {
	id            string
	seq           uint64
	created       int64
	amount        int64
	charge        string
	currency      string
	paymentIntent string
	reason        string
	metadata      map[string]string
}

func (r *refund) sortKey() sortKey { return sortKey{r.created, r.seq} }

// addCharge indexes a new charge; callers hold the write lock.
func (st *store) addCharge(c *charge) {
	st.charges[c.id] = c
	st.allCharges.add(c)
	if c.customer != "" {
		ix := st.byCustomer[c.customer]
		if ix == nil {
			ix = &index[*charge]{}
			st.byCustomer[c.customer] = ix
		}
		ix.add(c)
	}
	if p := st.intents[c.paymentIntent]; p != nil {
		p.charges.add(c)
		p.latestCharge = c.id
	}
}

// sorter is an index of any element type.
type sorter interface {
	isSorted() bool
	sort()
}

// rlockSorted returns holding the read lock, with every index pick returns
// sorted. Sorting needs the write lock, hence the loop: an out-of-order
// insert may slip in between the sort and the read lock.
func (st *store) rlockSorted(pick func() []sorter) {
	for {
		st.mu.RLock()
		ok := true
		for _, ix := range pick() {
			ok = ok && ix.isSorted()
		}
		if ok {
			return
		}
		st.mu.RUnlock()
		st.mu.Lock()
		for _, ix := range pick() {
			ix.sort()
		}
		st.mu.Unlock()
	}
}

func (ix *index[T]) isSorted() bool { return !ix.unsorted }

// --- JSON shapes, as stripe-go v76 decodes them ---

type customerJSON struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	Email       *string           `json:"email"`
	Name        *string           `json:"name"`
	Description *string           `json:"description"`
	Livemode    bool              `json:"livemode"`
	Metadata    map[string]string `json:"metadata"`
}

func (c *customer) json() customerJSON {
	return customerJSON{
		ID: c.id, Object: "customer", Created: c.created, Email: nilIfEmpty(c.email),
		Name: nilIfEmpty(c.name), Description: nilIfEmpty(c.description),
		Livemode: c.livemode, Metadata: nonNil(c.metadata),
	}
}

type outcomeJSON struct {
	AdviceCode    *string `json:"advice_code"`
	NetworkStatus string  `json:"network_status"`
	Reason        *string `json:"reason"`
	RiskLevel     string  `json:"risk_level"`
	SellerMessage string  `json:"seller_message"`
	Type          string  `json:"type"`
}

type chargeJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	Customer       *string           `json:"customer"`
	Description    *string           `json:"description"`
	Disputed       bool              `json:"disputed"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Outcome        outcomeJSON       `json:"outcome"`
	Paid           bool              `json:"paid"`
	PaymentIntent  any               `json:"payment_intent"` // id, expanded object or null
	PaymentMethod  *string           `json:"payment_method"`
	Refunded       bool              `json:"refunded"`
	Status         string            `json:"status"`
}

func (c *charge) json() chargeJSON {
	ok := c.status == "succeeded"
	captured := ok || c.status == "pending"
	out := chargeJSON{
		ID: c.id, Object: "charge", Amount: c.amount, AmountRefunded: c.amountRefunded,
		Captured: captured, Created: c.created, Currency: c.currency, Customer: nilIfEmpty(c.customer),
		Description: nilIfEmpty(c.description), Disputed: c.disputed, FailureCode: nilIfEmpty(c.failureCode),
		FailureMessage: nilIfEmpty(c.failureMessage), Livemode: c.livemode, Metadata: nonNil(c.metadata),
		Paid: ok, PaymentMethod: nilIfEmpty(c.paymentMethod),
		Refunded: ok && c.amountRefunded >= c.amount, Status: c.status,
	}
	if captured {
		// A pending debit is captured (the money is on its way) but not
		// paid until it settles.
		out.AmountCaptured = c.amount
		out.Outcome = outcomeJSON{NetworkStatus: "approved_by_network", RiskLevel: "normal",
			SellerMessage: "Payment complete.", Type: "authorized"}
	} else {
		reason := cmp.Or(c.declineCode, c.failureCode, "generic_decline")
		out.Outcome = outcomeJSON{AdviceCode: nilIfEmpty(c.adviceCode), NetworkStatus: "declined_by_network", Reason: &reason, RiskLevel: "normal",
			SellerMessage: "The bank did not return any further details with this decline.", Type: "issuer_declined"}
	}
	if c.paymentIntent != "" {
		out.PaymentIntent = c.paymentIntent
	}
	return out
}

type intentJSON struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           *string           `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *stripeError      `json:"last_payment_error"`
	LatestCharge       any               `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         *nextActionJSON   `json:"next_action"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

func (p *intent) json() intentJSON {
	out := intentJSON{
		ID: p.id, Object: "payment_intent", Amount: p.amount, CaptureMethod: "automatic",
		ConfirmationMethod: "automatic", Created: p.created, Currency: p.currency,
		Customer: nilIfEmpty(p.customer), Description: nilIfEmpty(p.description),
		Livemode: p.livemode, Metadata: nonNil(p.metadata), PaymentMethod: nilIfEmpty(p.paymentMethod),
		PaymentMethodTypes: []string{"card"}, Status: p.status,
		LastPaymentError: p.lastError, NextAction: p.nextAction,
	}
	if p.debit {
		out.PaymentMethodTypes = []string{"us_bank_account"}
	}
	if p.status == "succeeded" {
		out.AmountReceived = p.amount
	}
	if p.latestCharge != "" {
		out.LatestCharge = p.latestCharge
	}
	return out
}

type refundJSON struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	Metadata      map[string]string `json:"metadata"`
	PaymentIntent *string           `json:"payment_intent"`
	Reason        *string           `json:"reason"`
	Status        string            `json:"status"`
}

func (r *refund) json() refundJSON {
	return refundJSON{
		ID: r.id, Object: "refund", Amount: r.amount, Charge: r.charge, Created: r.created,
		Currency: r.currency, Metadata: nonNil(r.metadata), PaymentIntent: nilIfEmpty(r.paymentIntent),
		Reason: nilIfEmpty(r.reason), Status: "succeeded",
	}
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nonNil renders absent metadata as {} like Stripe, never null.
func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
