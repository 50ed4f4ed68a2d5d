package stripeapi

import (
	"context"
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// Metadata of pelguard's refunds. Every refund pelguard makes carries
// MetaMarker=MetaRefundMarker, so that after a ledger that lost commits
// (a failover to an asynchronous replica, a restore) its refund_ledger can
// be rebuilt from Stripe's refunds and the rolling refund cap still counts
// every refund pelguard made (IsPelguardRefund). A refund's marker value is
// not a charge's ("1"): IsPelguard never mistakes one for the other.
const (
	MetaRefundMarker = "refund"
	// MetaRefundSource names who asked for the refund (refund_ledger's
	// source: "auditor refund", "auto-refund", the console).
	MetaRefundSource = "source"
)

// IsPelguardRefund reports whether a refund's metadata carries pelguard's
// refund marker.
func IsPelguardRefund(md map[string]string) bool { return md[MetaMarker] == MetaRefundMarker }

// RefundRequest is one refund to make.
type RefundRequest struct {
	// ChargeID and IdempotencyKey are required: a retried refund must not
	// refund twice.
	ChargeID       string
	IdempotencyKey string
	// AmountCents is the amount to refund; 0 means what is left.
	AmountCents int64
	// Source, CustomerID and BillingPeriod go into the refund's metadata
	// (beside the marker), so a refund_ledger rebuilt from Stripe says who
	// asked and which key it was about. All optional.
	Source        string
	CustomerID    string
	BillingPeriod string
}

// Refund refunds amountCents of chargeID (0 = the remaining amount) with
// reason "duplicate" and pelguard's refund marker. idempotencyKey is
// required: a retried refund must not refund twice. RefundCharge says more
// about the refund in its metadata.
func (c *Client) Refund(ctx context.Context, chargeID string, amountCents int64, idempotencyKey string) (Refund, error) {
	return c.RefundCharge(ctx, RefundRequest{ChargeID: chargeID, AmountCents: amountCents, IdempotencyKey: idempotencyKey})
}

// RefundCharge refunds r.ChargeID with reason "duplicate" and metadata
// naming it pelguard's (see MetaRefundMarker).
func (c *Client) RefundCharge(ctx context.Context, r RefundRequest) (Refund, error) {
	if r.ChargeID == "" || r.IdempotencyKey == "" || r.AmountCents < 0 || len(r.IdempotencyKey) > 255 {
		err := &Error{Kind: ErrInvalidRequest, Message: "refund: charge id and idempotency key are required, amount must not be negative"}
		return Refund{}, err
	}
	var out Refund
	err := c.call(ctx, "refund", func(ctx context.Context) error {
		p := &stripe.RefundParams{
			Charge: stripe.String(r.ChargeID),
			Reason: stripe.String(string(stripe.RefundReasonDuplicate)),
		}
		if r.AmountCents > 0 {
			p.Amount = stripe.Int64(r.AmountCents)
		}
		p.AddMetadata(MetaMarker, MetaRefundMarker)
		for k, v := range map[string]string{MetaRefundSource: r.Source, MetaCustomerID: r.CustomerID, MetaBillingPeriod: r.BillingPeriod} {
			if v != "" {
				p.AddMetadata(k, v)
			}
		}
		p.Context = ctx
		p.SetIdempotencyKey(r.IdempotencyKey)
		re, err := c.api.Refunds.New(p)
		if err != nil {
			return err
		}
		out = toRefund(re)
		if out.ChargeID == "" {
			out.ChargeID = r.ChargeID
		}
		return nil
	})
	if err != nil {
		return Refund{}, fmt.Errorf("refunding %s: %w", r.ChargeID, err)
	}
	return out, nil
}

func toRefund(re *stripe.Refund) Refund {
	out := Refund{
		ID: re.ID, Status: string(re.Status), AmountCents: re.Amount, Currency: string(re.Currency),
		Created: time.Unix(re.Created, 0).UTC(), Reason: string(re.Reason), Metadata: re.Metadata,
	}
	if re.Charge != nil {
		out.ChargeID = re.Charge.ID
	}
	return out
}

// ListRefunds streams every refund of the account created in [from, to),
// newest first, a page of 100 at a time, each page through the client's
// rate limit (GET /v1/refunds counts against its own endpoint limit). An
// error from fn stops the listing and is returned (wrapped). It needs the
// key's Refunds read permission (Write implies it): ErrPermission without.
func (c *Client) ListRefunds(ctx context.Context, from, to time.Time, fn func(Refund) error) error {
	if !from.Before(to) {
		return &Error{Kind: ErrInvalidRequest, Message: fmt.Sprintf("list refunds: empty window [%s, %s)", from, to)}
	}
	var fnErr error
	err := c.call(ctx, "list_refunds", func(ctx context.Context) error {
		p := &stripe.RefundListParams{}
		p.Context = ctx
		p.Limit = stripe.Int64(listPageSize)
		p.CreatedRange = &stripe.RangeQueryParams{GreaterThanOrEqual: ceilUnix(from), LesserThan: ceilUnix(to)}
		it := c.api.Refunds.List(p)
		for it.Next() {
			if err := fn(toRefund(it.Refund())); err != nil {
				fnErr = err
				return nil
			}
		}
		return it.Err()
	})
	if err != nil {
		return fmt.Errorf("listing refunds in [%s, %s): %w", from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), err)
	}
	if fnErr != nil {
		return fmt.Errorf("listing refunds: %w", fnErr)
	}
	return nil
}
