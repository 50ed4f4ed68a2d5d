package stripeapi

import (
	"context"
	"errors"
	"fmt"

	"github.com/stripe/stripe-go/v76"
)

// Intent is the adapter's view of a PaymentIntent: enough to decide what an
// earlier attempt left behind before the next one is made.
type Intent struct {
	ID     string
	Status string // requires_payment_method, requires_action, processing, succeeded, canceled, …
	// LatestChargeID and LatestChargeStatus describe the intent's latest
	// charge ("" when it has none).
	LatestChargeID     string
	LatestChargeStatus string
}

// Open reports whether the intent can still move money: anything but
// succeeded, processing or canceled can be confirmed again (by the customer
// on-session, or by a retry), so the next attempt cancels it first.
func (i Intent) Open() bool {
	switch stripe.PaymentIntentStatus(i.Status) {
	case stripe.PaymentIntentStatusSucceeded, stripe.PaymentIntentStatusProcessing, stripe.PaymentIntentStatusCanceled:
		return false
	}
	return true
}

func toIntent(pi *stripe.PaymentIntent) Intent {
	out := Intent{ID: pi.ID, Status: string(pi.Status)}
	if ch := pi.LatestCharge; ch != nil {
		out.LatestChargeID, out.LatestChargeStatus = ch.ID, string(ch.Status)
	}
	return out
}

// GetIntent reads one PaymentIntent with its latest charge. A GET: safe to
// repeat.
func (c *Client) GetIntent(ctx context.Context, id string) (Intent, error) {
	if id == "" {
		return Intent{}, &Error{Kind: ErrInvalidRequest, Message: "get intent: id is required"}
	}
	var out Intent
	err := c.call(ctx, "get_intent", func(ctx context.Context) error {
		p := &stripe.PaymentIntentParams{}
		p.Context = ctx
		p.AddExpand("latest_charge")
		pi, err := c.api.PaymentIntents.Get(id, p)
		if err != nil {
			return err
		}
		out = toIntent(pi)
		return nil
	})
	if err != nil {
		return Intent{}, fmt.Errorf("reading payment intent %s: %w", id, err)
	}
	return out, nil
}

// CancelIntent cancels an open PaymentIntent so that it can never be
// confirmed again (the attempt it belonged to is over). An intent that is
// already canceled is not an error: the intent as Stripe now has it is
// returned, so the caller decides from its status (a succeeded or
// processing intent cannot be canceled and is returned as it is).
func (c *Client) CancelIntent(ctx context.Context, id string, idempotencyKey string) (Intent, error) {
	if id == "" || idempotencyKey == "" {
		return Intent{}, &Error{Kind: ErrInvalidRequest, Message: "cancel intent: id and idempotency key are required"}
	}
	var out Intent
	err := c.call(ctx, "cancel_intent", func(ctx context.Context) error {
		p := &stripe.PaymentIntentCancelParams{}
		p.Context = ctx
		p.SetIdempotencyKey(idempotencyKey)
		pi, err := c.api.PaymentIntents.Cancel(id, p)
		if err != nil {
			var se *stripe.Error
			if errors.As(err, &se) && se.Code == stripe.ErrorCodePaymentIntentUnexpectedState && se.PaymentIntent != nil {
				out = toIntent(se.PaymentIntent)
				return nil
			}
			return err
		}
		out = toIntent(pi)
		return nil
	})
	if err != nil {
		return Intent{}, fmt.Errorf("canceling payment intent %s: %w", id, err)
	}
	return out, nil
}

// MetaAttempt is the charge metadata naming the attempt of a key's charge
// (attempt 2 on); the idempotency_key metadata stays the row's key, so
// every attempt's charge matches the ledger row.
const MetaAttempt = "attempt"
