package stripeapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// ChargeRequest is one charge to create.
type ChargeRequest struct {
	// IdempotencyKey is sent as the Idempotency-Key header. Empty only for
	// the naive baseline: stripe-go then invents a random key per call, which
	// protects its own retries but not a redelivery.
	IdempotencyKey   string
	StripeCustomerID string
	AmountCents      int64
	Currency         string
	Description      string
	// Metadata is sent as is; pelguard callers use PelguardMetadata.
	Metadata map[string]string
	// PaymentMethodID optionally names the payment method of the intent
	// (payment_intents mode); when set, no default-payment-method lookup
	// is made.
	PaymentMethodID string
}

// Charge is the adapter's view of a Stripe charge.
type Charge struct {
	ID               string
	PaymentIntentID  string
	StripeCustomerID string
	Currency         string
	Status           string
	Description      string

	AmountCents         int64
	AmountRefundedCents int64
	Refunded            bool
	// Disputed is Stripe's charge.disputed: a dispute was opened on it.
	Disputed bool
	// FailureCode and FailureMessage say why a failed charge failed (a
	// returned bank debit: insufficient_funds, account_closed, …).
	FailureCode    string
	FailureMessage string
	Created        time.Time
	// Metadata is the charge's metadata or, for a charge of a PaymentIntent
	// whose own metadata is empty, the intent's metadata (from expand).
	Metadata map[string]string
}

// Refund is the adapter's view of a Stripe refund.
type Refund struct {
	ID          string
	ChargeID    string
	Status      string
	AmountCents int64
	// Currency, Created, Reason and Metadata are filled by ListRefunds
	// (and Currency, Created by RefundCharge).
	Currency string
	Created  time.Time
	Reason   string
	Metadata map[string]string
}

func (r ChargeRequest) validate() error {
	var missing []string
	if r.StripeCustomerID == "" {
		missing = append(missing, "StripeCustomerID")
	}
	if r.Currency == "" {
		missing = append(missing, "Currency")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", ErrInvalidRequest, strings.Join(missing, ", "))
	}
	if r.AmountCents <= 0 {
		return fmt.Errorf("%w: AmountCents must be positive, got %d", ErrInvalidRequest, r.AmountCents)
	}
	if len(r.IdempotencyKey) > 255 {
		return fmt.Errorf("%w: idempotency key longer than 255 characters", ErrInvalidRequest)
	}
	return nil
}

// Charge creates one charge. In payment_intents mode it creates a
// PaymentIntent with confirm=true and off_session=true and returns the
// intent's latest charge; in charges mode it uses the Charges API. A transient
// error means the charge may exist: retry with the same IdempotencyKey.
func (c *Client) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	var out Charge
	if err := req.validate(); err != nil {
		return out, &Error{Kind: ErrInvalidRequest, Message: "charge: " + err.Error(), Err: err}
	}
	err := c.call(ctx, "charge", func(ctx context.Context) error {
		var err error
		if c.mode == ModeCharges {
			out, err = c.chargeViaCharges(ctx, req)
		} else {
			out, err = c.chargeViaIntent(ctx, req)
		}
		return err
	})
	if err != nil {
		return Charge{}, fmt.Errorf("charging %s: %w", req.StripeCustomerID, err)
	}
	return out, nil
}

func (c *Client) chargeViaCharges(ctx context.Context, req ChargeRequest) (Charge, error) {
	p := &stripe.ChargeParams{
		Amount:   stripe.Int64(req.AmountCents),
		Currency: stripe.String(req.Currency),
		Customer: stripe.String(req.StripeCustomerID),
	}
	if req.Description != "" {
		p.Description = stripe.String(req.Description)
	}
	p.Context = ctx
	for k, v := range req.Metadata {
		p.AddMetadata(k, v)
	}
	if req.IdempotencyKey != "" {
		p.SetIdempotencyKey(req.IdempotencyKey)
	}
	ch, err := c.api.Charges.New(p)
	if err != nil {
		return Charge{}, err
	}
	return toCharge(ch), nil
}

func (c *Client) chargeViaIntent(ctx context.Context, req ChargeRequest) (Charge, error) {
	p := &stripe.PaymentIntentParams{
		Amount:     stripe.Int64(req.AmountCents),
		Currency:   stripe.String(req.Currency),
		Customer:   stripe.String(req.StripeCustomerID),
		Confirm:    stripe.Bool(true),
		OffSession: stripe.Bool(true),
	}
	if req.Description != "" {
		p.Description = stripe.String(req.Description)
	}
	switch {
	case req.PaymentMethodID != "":
		p.PaymentMethod = stripe.String(req.PaymentMethodID)
	case c.resolvePM:
		pm, err := c.defaultPaymentMethod(ctx, req.StripeCustomerID)
		if err != nil {
			return Charge{}, err
		}
		p.PaymentMethod = stripe.String(pm)
	}
	p.Context = ctx
	p.AddExpand("latest_charge")
	for k, v := range req.Metadata {
		p.AddMetadata(k, v)
	}
	if req.IdempotencyKey != "" {
		p.SetIdempotencyKey(req.IdempotencyKey)
	}
	pi, err := c.api.PaymentIntents.New(p)
	if err != nil {
		return Charge{}, err
	}
	ch := pi.LatestCharge
	if ch == nil || ch.ID == "" {
		// An intent that needs the customer (requires_action for
		// authentication, requires_payment_method) has no charge: nothing
		// was charged and only the customer can fix it. Anything else
		// without a charge needs a human.
		e := &Error{Kind: ErrInvalidRequest, PaymentIntentID: pi.ID,
			Message: fmt.Sprintf("payment intent %s has status %q and no charge", pi.ID, pi.Status)}
		switch pi.Status {
		case stripe.PaymentIntentStatusRequiresAction:
			e.Kind, e.Message = ErrActionRequired, fmt.Sprintf("payment intent %s requires_action: the customer must authenticate the payment", pi.ID)
		case stripe.PaymentIntentStatusRequiresPaymentMethod:
			e.Kind, e.Message = ErrActionRequired, fmt.Sprintf("payment intent %s requires_payment_method: the customer must add or fix a payment method", pi.ID)
		}
		return Charge{}, e
	}
	if ch.Object == "" {
		// Not expanded (a server that ignores expand): fetch it. A GET, so
		// it is safe to repeat.
		gp := &stripe.ChargeParams{}
		gp.Context = ctx
		full, err := c.api.Charges.Get(ch.ID, gp)
		if err != nil {
			return Charge{}, err
		}
		ch = full
	}
	out := toCharge(ch)
	out.PaymentIntentID = pi.ID
	if len(out.Metadata) == 0 && len(pi.Metadata) > 0 {
		out.Metadata = pi.Metadata
	}
	if out.StripeCustomerID == "" && pi.Customer != nil {
		out.StripeCustomerID = pi.Customer.ID
	}
	return out, nil
}

// defaultPaymentMethod returns the customer's invoice default payment method,
// or its legacy default source.
func (c *Client) defaultPaymentMethod(ctx context.Context, customerID string) (string, error) {
	p := &stripe.CustomerParams{}
	p.Context = ctx
	cust, err := c.api.Customers.Get(customerID, p)
	if err != nil {
		return "", err
	}
	if cust.InvoiceSettings != nil && cust.InvoiceSettings.DefaultPaymentMethod != nil && cust.InvoiceSettings.DefaultPaymentMethod.ID != "" {
		return cust.InvoiceSettings.DefaultPaymentMethod.ID, nil
	}
	if cust.DefaultSource != nil && cust.DefaultSource.ID != "" {
		return cust.DefaultSource.ID, nil
	}
	return "", &Error{Kind: ErrActionRequired, Message: fmt.Sprintf("customer %s has no default payment method: the customer must add one", customerID)}
}

// ChargeQuery names the charge of one ledger key at one Stripe customer,
// for FindCharge.
type ChargeQuery struct {
	// StripeCustomerID and IdempotencyKey are required; charges created
	// before Since are not looked at.
	StripeCustomerID string
	Since            time.Time
	IdempotencyKey   string

	// The key's business identity, to match charges that carry no
	// pelguard marker (invariant 9): a team's old consumer's, or pelguard's
	// own made with its metadata off. An unmarked succeeded charge of the
	// customer matches when its amount and currency are these and its
	// billing period is BillingPeriod: by metadata billing_period (and
	// customer_id when present) or, without it, by a description that is
	// Description or names BillingPeriod (see describesPeriod). Leave
	// AmountCents 0 to match marked charges only.
	CustomerID    string
	BillingPeriod string
	AmountCents   int64
	Currency      string
	Description   string
	// ChargeIDs are charge or payment intent ids the ledger records for
	// the key: a charge with one of them matches whatever its metadata.
	ChargeIDs []string
}

// Matches reports whether ch is a charge of q's key (any status).
func (q ChargeQuery) Matches(ch Charge) bool {
	if ch.StripeCustomerID != "" && ch.StripeCustomerID != q.StripeCustomerID {
		return false
	}
	for _, id := range q.ChargeIDs {
		if id != "" && (ch.ID == id || ch.PaymentIntentID == id) {
			return true
		}
	}
	if IsPelguard(ch.Metadata) {
		return ch.Metadata[MetaIdempotencyKey] == q.IdempotencyKey
	}
	if q.AmountCents <= 0 || ch.AmountCents != q.AmountCents || !strings.EqualFold(ch.Currency, q.Currency) {
		return false
	}
	if p := ch.Metadata[MetaBillingPeriod]; p != "" {
		c := ch.Metadata[MetaCustomerID]
		return p == q.BillingPeriod && (c == "" || c == q.CustomerID)
	}
	return q.Description != "" && ch.Description == q.Description || describesPeriod(ch.Description, q.BillingPeriod)
}

// describesPeriod reports whether a charge's description names period as
// a whole token, case aside ("Acme usage 2026-11 (42 units)" names
// 2026-11; "2026-110", "12026-11" and the date "2026-11-01" do not).
//
// Why not the exact description: in switch mode the team's old consumer
// and pelguard describe the same charge differently (pelguard's
// --description), and a look-up that wanted pelguard's wording missed the
// team's charge, so the key was charged again once Stripe forgot it (24 h):
// a double charge. Why not customer, amount and currency alone, within the
// look-up's window: a customer billed a flat amount every period has the
// previous period's charge in the window (a period billed in arrears is
// charged in the next one), and taking it would leave this period unbilled
// for good. A charge of the same customer, amount and currency whose
// description names this very period is this period's charge; one that
// names no period, or another, is not matched, so the look-up answers
// "not there" as it did before, and the idempotency key and the consumer's
// alert, not a guess, decide. foundElsewhere still refuses a match the
// ledger records under another key.
func describesPeriod(desc, period string) bool {
	if period == "" {
		return false
	}
	desc, period = strings.ToLower(desc), strings.ToLower(period)
	for i := 0; ; {
		j := strings.Index(desc[i:], period)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(period)
		// A date in the period ("billed 2026-11-01") does not name it: the
		// token must not go on with "-" and more of a date.
		date := end+1 < len(desc) && desc[end] == '-' && isPeriodChar(desc[end+1])
		if (start == 0 || !isPeriodChar(desc[start-1])) && (end == len(desc) || !isPeriodChar(desc[end])) && !date {
			return true
		}
		i = start + 1
	}
}

// isPeriodChar: a character that would continue a period token (periods
// are like 2026-11, 2026-Q4, 2026-W07).
func isPeriodChar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// FindCharge looks for the succeeded (or pending) charge of q's key created at or after
// q.Since: pelguard's marked charges by their idempotency key, and charges
// without the marker by q's business identity (see ChargeQuery). It is how a
// takeover past Stripe's 24 h idempotency window, an idempotency_error, or
// the first charge of a period with imported history decides whether the
// key was already charged. Of several matches it returns the canonical
// one: the earliest that still holds money, else the earliest (a refunded
// charge still shows the key was charged). found=false with a nil error
// means "looked, not there"; any error means "could not tell": never charge
// on an error.
func (c *Client) FindCharge(ctx context.Context, q ChargeQuery) (Charge, bool, error) {
	if q.StripeCustomerID == "" || q.IdempotencyKey == "" {
		err := &Error{Kind: ErrInvalidRequest, Message: "find charge: customer and idempotency key are required"}
		return Charge{}, false, err
	}
	var matches []Charge
	err := c.call(ctx, "find_charge", func(ctx context.Context) error {
		matches = matches[:0]
		p := &stripe.ChargeListParams{Customer: stripe.String(q.StripeCustomerID)}
		p.CreatedRange = &stripe.RangeQueryParams{GreaterThanOrEqual: q.Since.Unix()}
		return c.listCharges(ctx, p, func(ch Charge) (bool, error) {
			// A pending charge (a bank debit in motion) shows the key was
			// charged as surely as a succeeded one.
			if (ch.Status == string(stripe.ChargeStatusSucceeded) || ch.Status == string(stripe.ChargeStatusPending)) && q.Matches(ch) {
				matches = append(matches, ch)
			}
			return false, nil
		})
	})
	if err != nil {
		return Charge{}, false, fmt.Errorf("finding charge of %s since %s: %w", q.StripeCustomerID, q.Since.UTC().Format(time.RFC3339), err)
	}
	best, ok := Canonical(matches)
	return best, ok, nil
}

// Canonical is the one canonical rule for charges of one key when the
// ledger names none: the earliest that still holds money (net of refunds),
// else the earliest. ok is false for no charges.
func Canonical(chs []Charge) (Charge, bool) {
	var best Charge
	found, holds := false, false
	for _, ch := range chs {
		h := ch.AmountCents-ch.AmountRefundedCents > 0
		switch {
		case !found, h && !holds, h == holds && (ch.Created.Before(best.Created) || ch.Created.Equal(best.Created) && ch.ID < best.ID):
			best, found, holds = ch, true, h
		}
	}
	return best, found
}

// ListCharges streams every charge created in [from, to), newest first as
// Stripe returns them, one page of 100 in memory at a time. Metadata falls
// back to the payment intent's, which is read (expanded) only for pages that
// need it (see listCharges). Each page waits on
// the shared rate limit. An error from fn stops the listing and is returned
// as is (wrapped).
func (c *Client) ListCharges(ctx context.Context, from, to time.Time, fn func(Charge) error) error {
	if !from.Before(to) {
		return &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("list charges: empty window [%s, %s)", from, to)}
	}
	var fnErr error
	err := c.call(ctx, "list_charges", func(ctx context.Context) error {
		p := &stripe.ChargeListParams{}
		// Stripe's created filter has one-second resolution: round from
		// up and to up so that [from, to) holds for sub-second bounds.
		p.CreatedRange = &stripe.RangeQueryParams{
			GreaterThanOrEqual: ceilUnix(from),
			LesserThan:         ceilUnix(to),
		}
		return c.listCharges(ctx, p, func(ch Charge) (bool, error) {
			if err := fn(ch); err != nil {
				fnErr = err
				return true, nil
			}
			return false, nil
		})
	})
	if err != nil {
		return fmt.Errorf("listing charges in [%s, %s): %w", from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), err)
	}
	if fnErr != nil {
		return fmt.Errorf("listing charges: %w", fnErr)
	}
	return nil
}

func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

func toCharge(ch *stripe.Charge) Charge {
	out := Charge{
		ID:                  ch.ID,
		Currency:            string(ch.Currency),
		Status:              string(ch.Status),
		Description:         ch.Description,
		AmountCents:         ch.Amount,
		AmountRefundedCents: ch.AmountRefunded,
		Refunded:            ch.Refunded,
		Disputed:            ch.Disputed,
		FailureCode:         ch.FailureCode,
		FailureMessage:      ch.FailureMessage,
		Created:             time.Unix(ch.Created, 0).UTC(),
		Metadata:            ch.Metadata,
	}
	if ch.Customer != nil {
		out.StripeCustomerID = ch.Customer.ID
	}
	if pi := ch.PaymentIntent; pi != nil {
		out.PaymentIntentID = pi.ID
		if len(out.Metadata) == 0 && len(pi.Metadata) > 0 {
			out.Metadata = pi.Metadata
		}
	}
	return out
}

// ErrNoSuchCharge is GetCharge's answer for a charge id Stripe does not
// have (404 resource_missing): a team's table naming a charge of another
// account, a test-mode id, or a typo.
var ErrNoSuchCharge = errors.New("stripe: no such charge")

// GetCharge reads one charge, with its intent's metadata when the charge
// has none. A GET: safe to repeat.
func (c *Client) GetCharge(ctx context.Context, id string) (Charge, error) {
	if id == "" {
		return Charge{}, &Error{Kind: ErrInvalidRequest, Message: "get charge: id is required"}
	}
	var out Charge
	err := c.call(ctx, "get_charge", func(ctx context.Context) error {
		p := &stripe.ChargeParams{}
		p.Context = ctx
		p.AddExpand("payment_intent")
		ch, err := c.api.Charges.Get(id, p)
		if err != nil {
			var se *stripe.Error
			if errors.As(err, &se) && fromStripe(se) && se.HTTPStatusCode == http.StatusNotFound {
				return &Error{Kind: ErrInvalidRequest, HTTPStatus: http.StatusNotFound, Message: "no such charge", Err: ErrNoSuchCharge}
			}
			return err
		}
		out = toCharge(ch)
		return nil
	})
	if err != nil {
		return Charge{}, fmt.Errorf("reading charge %s: %w", id, err)
	}
	return out, nil
}
