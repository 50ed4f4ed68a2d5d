package stripeapi_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/stripemocktest"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestStripeMockConformance runs every adapter call against Stripe's
// official stripe-mock, which rejects (4xx) any parameter or shape that
// Stripe's OpenAPI spec does not allow.
func TestStripeMockConformance(t *testing.T) {
	t.Parallel()
	url := stripemocktest.Start(t)
	// Not defer: the parallel subtests run after this function returns.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)

	newClient := func(t *testing.T, mode stripeapi.Mode, resolvePM bool) *stripeapi.Client {
		t.Helper()
		c, err := stripeapi.New(stripeapi.Config{
			APIKey:               stripemocktest.APIKey,
			BaseURL:              url,
			Mode:                 mode,
			ResolvePaymentMethod: resolvePM,
			Logger:               slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return c
	}
	req := stripeapi.ChargeRequest{
		IdempotencyKey:   "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c",
		StripeCustomerID: "cus_mock",
		AmountCents:      2500,
		Currency:         "usd",
		Description:      "Usage billing for 2026-11",
		Metadata:         stripeapi.PelguardMetadata("c_42", "2026-11", "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c"),
	}

	for _, tc := range []struct {
		name      string
		mode      stripeapi.Mode
		resolvePM bool
		req       stripeapi.ChargeRequest
	}{
		{"payment_intents", stripeapi.ModePaymentIntents, false, req},
		{"payment_intents_explicit_pm", stripeapi.ModePaymentIntents, false, withPM(req, "pm_card_visa")},
		{"charges", stripeapi.ModeCharges, false, req},
		{"charges_naive_no_key_no_metadata", stripeapi.ModeCharges, false, stripeapi.ChargeRequest{
			StripeCustomerID: "cus_mock", AmountCents: 2500, Currency: "usd", Description: "Usage billing for 2026-11",
		}},
	} {
		t.Run("Charge/"+tc.name, func(t *testing.T) {
			t.Parallel()
			ch, err := newClient(t, tc.mode, tc.resolvePM).Charge(ctx, tc.req)
			if err != nil {
				t.Fatalf("Charge rejected by stripe-mock: %v", err)
			}
			if ch.ID == "" {
				t.Fatalf("Charge returned no id: %+v", ch)
			}
			if tc.mode == stripeapi.ModePaymentIntents && ch.PaymentIntentID == "" {
				t.Errorf("payment intent id missing: %+v", ch)
			}
		})
	}

	t.Run("Charge/payment_intents_resolve_pm", func(t *testing.T) {
		t.Parallel()
		// stripe-mock's customer fixture has no default payment method, so
		// the lookup (GET /v1/customers/{id}) is accepted and the adapter
		// refuses to create an intent that real Stripe would reject.
		_, err := newClient(t, stripeapi.ModePaymentIntents, true).Charge(ctx, req)
		if !errors.Is(err, stripeapi.ErrActionRequired) {
			t.Fatalf("want ErrActionRequired (no default payment method: the customer must add one), got %v", err)
		}
	})

	t.Run("FindCharge", func(t *testing.T) {
		t.Parallel()
		// stripe-mock's fixtures carry no pelguard metadata: the point is that
		// the list request (customer, created[gte], limit, expand) is accepted.
		_, _, err := newClient(t, "", false).FindCharge(ctx, stripeapi.ChargeQuery{StripeCustomerID: "cus_mock", Since: time.Now().Add(-48 * time.Hour), IdempotencyKey: "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c", AmountCents: 100, Currency: "usd", Description: "Usage billing for 2026-11"})
		if err != nil {
			t.Fatalf("FindCharge rejected by stripe-mock: %v", err)
		}
	})

	t.Run("ListCharges", func(t *testing.T) {
		t.Parallel()
		n := 0
		err := newClient(t, "", false).ListCharges(ctx, time.Unix(0, 0), time.Now(), func(stripeapi.Charge) error {
			n++
			// stripe-mock may repeat its fixture page forever; one page is
			// enough to prove the request shape.
			if n >= 100 {
				return errStopList
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopList) {
			t.Fatalf("ListCharges rejected by stripe-mock: %v", err)
		}
		if n == 0 {
			t.Fatalf("ListCharges returned nothing")
		}
	})

	t.Run("Refund", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, "", false)
		if _, err := c.Refund(ctx, "ch_mock", 2500, "refund-dup-ch_mock"); err != nil {
			t.Fatalf("Refund rejected by stripe-mock: %v", err)
		}
		if _, err := c.Refund(ctx, "ch_mock", 0, "refund-dup-ch_mock-full"); err != nil {
			t.Fatalf("full Refund rejected by stripe-mock: %v", err)
		}
		if _, err := c.RefundCharge(ctx, stripeapi.RefundRequest{ChargeID: "ch_mock", AmountCents: 100, IdempotencyKey: "refund-dup-ch_mock-md",
			Source: "auditor refund", CustomerID: "c_42", BillingPeriod: "2026-11"}); err != nil {
			t.Fatalf("RefundCharge (metadata) rejected by stripe-mock: %v", err)
		}
	})

	t.Run("ListRefunds", func(t *testing.T) {
		t.Parallel()
		n := 0
		err := newClient(t, "", false).ListRefunds(ctx, time.Unix(0, 0), time.Now(), func(stripeapi.Refund) error {
			n++
			if n >= 100 { // stripe-mock may repeat its fixture page forever
				return errStopList
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopList) {
			t.Fatalf("ListRefunds rejected by stripe-mock: %v", err)
		}
		if n == 0 {
			t.Fatalf("ListRefunds returned nothing")
		}
	})

	t.Run("Intents", func(t *testing.T) {
		t.Parallel()
		// Closing an earlier attempt: GET /v1/payment_intents/{id} with
		// expand[]=latest_charge and POST …/cancel with an idempotency key.
		c := newClient(t, "", false)
		it, err := c.GetIntent(ctx, "pi_mock")
		if err != nil || it.ID == "" || it.Status == "" {
			t.Fatalf("GetIntent: %+v %v", it, err)
		}
		it, err = c.CancelIntent(ctx, "pi_mock", "pelguard-cancel-pi_mock")
		if err != nil || it.ID == "" || it.Status == "" {
			t.Fatalf("CancelIntent rejected by stripe-mock: %+v %v", it, err)
		}
	})

	t.Run("GetCharge", func(t *testing.T) {
		t.Parallel()
		// Polling a processing row's charge.
		ch, err := newClient(t, "", false).GetCharge(ctx, "ch_mock")
		if err != nil || ch.ID == "" || ch.Status == "" {
			t.Fatalf("GetCharge: %+v %v", ch, err)
		}
	})

	// Billing meters: request and response shapes only. stripe-mock is
	// stateless, so the identifier window, the one-call-per-customer-per-
	// meter rule, the timestamp bounds and the summaries' values are
	// checked against the emulator (meters_test.go), whose rules are ours
	// to keep faithful to Stripe's docs.
	t.Run("Meters", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, "", false)
		m, err := c.CreateMeter(ctx, stripeapi.MeterSpec{DisplayName: "API calls", EventName: "api_calls", Formula: stripeapi.MeterFormulaSum})
		if err != nil || m.ID == "" {
			t.Fatalf("CreateMeter rejected by stripe-mock: %+v %v", m, err)
		}
		meters, err := c.ListMeters(ctx)
		if err != nil || len(meters) == 0 || meters[0].EventName == "" {
			t.Fatalf("ListMeters: %+v %v", meters, err)
		}
		res, err := c.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: "api_calls", StripeCustomerID: "cus_mock",
			Value: 25, Identifier: "pelguard-3f1c2a9b8d7e6f5a", Timestamp: time.Now().Add(-time.Hour)})
		if err != nil || res.Identifier == "" {
			t.Fatalf("SendMeterEvent rejected by stripe-mock: %+v %v", res, err)
		}
		if _, err := c.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: "api_calls", StripeCustomerID: "cus_mock", Value: -3}); err != nil {
			t.Fatalf("SendMeterEvent (no identifier, no timestamp, negative) rejected by stripe-mock: %v", err)
		}
		if err := c.CancelMeterEvent(ctx, "api_calls", "pelguard-3f1c2a9b8d7e6f5a"); err != nil {
			t.Fatalf("CancelMeterEvent rejected by stripe-mock: %v", err)
		}
		day := time.Now().UTC().Truncate(24 * time.Hour)
		for _, w := range []stripeapi.MeterWindow{stripeapi.MeterWindowNone, stripeapi.MeterWindowHour, stripeapi.MeterWindowDay} {
			sums, err := c.MeterEventSummaries(ctx, m.ID, "cus_mock", day.Add(-24*time.Hour), day, w)
			if err != nil || len(sums) == 0 {
				t.Fatalf("MeterEventSummaries (window %q) rejected by stripe-mock: %v %v", w, sums, err)
			}
		}
	})

	t.Run("InvalidParameterIsInvalidRequest", func(t *testing.T) {
		t.Parallel()
		// An empty metadata key passes our validation but not the spec:
		// proves stripe-mock does validate (so the passes above mean
		// something) and that its 400 is classified as invalid request.
		bad := req
		bad.IdempotencyKey = ""
		bad.Metadata = map[string]string{"": "x"}
		_, err := newClient(t, stripeapi.ModeCharges, false).Charge(ctx, bad)
		if err == nil {
			t.Fatal("stripe-mock accepted an empty metadata key: it is not validating requests")
		}
		if !errors.Is(err, stripeapi.ErrInvalidRequest) {
			t.Fatalf("want ErrInvalidRequest, got %v", err)
		}
	})
}

func withPM(r stripeapi.ChargeRequest, pm string) stripeapi.ChargeRequest {
	r.PaymentMethodID = pm
	return r
}

var errStopList = errors.New("stop")
