package consumer

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/stripeapi"
)

// Span attributes. They name the event and its outcome only: never a
// secret, card data, a Stripe customer's e-mail or an error's text (a Stripe
// or driver message may quote a request), so an exported trace is as safe
// to share as the stream itself.
const (
	attrStream           = attribute.Key("pelguard.stream")
	attrMessageID        = attribute.Key("pelguard.message_id")
	attrCustomerID       = attribute.Key("pelguard.customer_id")
	attrBillingPeriod    = attribute.Key("pelguard.billing_period")
	attrOutcome          = attribute.Key("pelguard.outcome")
	attrChargeID         = attribute.Key("pelguard.charge_id")
	attrDeadLetterReason = attribute.Key("pelguard.dead_letter_reason")
	attrDecision         = attribute.Key("pelguard.ledger.decision")
	attrStripeResult     = attribute.Key("pelguard.stripe.result")
	attrFound            = attribute.Key("pelguard.stripe.found")
)

// startEvent opens the pelguard.event span of one entry, a child of whatever
// span h.ctx carries (the reaper's pelguard.redrive) or a trace of its own.
// A zero readAt starts it now.
func (p *Processor) startEvent(h *hold, id string, readAt time.Time) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrStream.String(h.stream), attrMessageID.String(id)),
	}
	if !readAt.IsZero() {
		opts = append(opts, trace.WithTimestamp(readAt))
	}
	return p.tracer.Start(h.ctx, "pelguard.event", opts...)
}

// endEvent records the outcome. A dependency failure sets the status to
// Error with the outcome only, not err's text.
func endEvent(span trace.Span, out Outcome, err error) {
	span.SetAttributes(attrOutcome.String(string(out)))
	if err != nil {
		span.SetStatus(codes.Error, string(out))
	}
	span.End()
}

// stripeCharge is Stripe.Charge in a stripe.charge span.
func (p *Processor) stripeCharge(ctx context.Context, req stripeapi.ChargeRequest) (stripeapi.Charge, error) {
	ctx, span := p.tracer.Start(ctx, "stripe.charge", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	ch, err := p.cfg.Stripe.Charge(ctx, req)
	span.SetAttributes(attrStripeResult.String(resultClass(err)))
	if err != nil {
		span.SetStatus(codes.Error, resultClass(err))
	} else {
		span.SetAttributes(attrChargeID.String(ch.ID))
	}
	return ch, err
}

// findCharge is Stripe.FindCharge in a stripe.find_charge span.
func (p *Processor) findCharge(ctx context.Context, q stripeapi.ChargeQuery) (stripeapi.Charge, bool, error) {
	ctx, span := p.tracer.Start(ctx, "stripe.find_charge", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	ch, ok, err := p.cfg.Stripe.FindCharge(ctx, q)
	span.SetAttributes(attrStripeResult.String(resultClass(err)), attrFound.Bool(ok))
	if err != nil {
		span.SetStatus(codes.Error, resultClass(err))
	} else if ok {
		span.SetAttributes(attrChargeID.String(ch.ID))
	}
	return ch, ok, err
}
