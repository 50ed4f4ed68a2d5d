package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// The meter consumer's outcome table: what each answer to a meter event's
// call records. An answer that does not say whether Stripe counted the
// event releases it (sent again under its identifier while Stripe guards
// it, parked past that); only Stripe's own refusal fails it.
func TestMeterOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want meterledger.Result
	}{
		{"200", nil, meterledger.Delivered},
		{"duplicate identifier (an earlier attempt got through)", &stripeapi.Error{Kind: stripeapi.ErrDuplicateIdentifier, HTTPStatus: 400}, meterledger.Delivered},
		{"identifier with other parameters", &stripeapi.Error{Kind: stripeapi.ErrIdempotencyMismatch, HTTPStatus: 400}, meterledger.Park},
		{"refused: no such meter", &stripeapi.Error{Kind: stripeapi.ErrInvalidRequest, HTTPStatus: 400}, meterledger.Failed},
		{"429", &stripeapi.Error{Kind: stripeapi.ErrTransient, HTTPStatus: 429}, meterledger.Release},
		{"500", &stripeapi.Error{Kind: stripeapi.ErrTransient, HTTPStatus: 500}, meterledger.Release},
		{"timeout", fmt.Errorf("sending: %w", context.DeadlineExceeded), meterledger.Release},
		{"cancelled", context.Canceled, meterledger.Release},
		{"401: nothing counted, a key to fix, then a replay", &stripeapi.Error{Kind: stripeapi.ErrAuthentication, HTTPStatus: 401}, meterledger.Failed},
		{"403: a permission missing", &stripeapi.Error{Kind: stripeapi.ErrPermission, HTTPStatus: 403}, meterledger.Failed},
		{"unknown", errors.New("eof"), meterledger.Release},
	} {
		if got := meterOutcome(meterledger.Hold{}, tc.err); got.Result != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got.Result, tc.want)
		}
	}
}
