package stripeapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/stripe/stripe-go/v76"

	"github.com/pelguard/pelguard/internal/redact"
)

// Error kinds. Every error returned by Client wraps exactly one of them, so a
// caller branches with errors.Is and never looks at stripe-go types.
var (
	// ErrTransient: the outcome is unknown or the request was not processed
	// (timeout, network error, 5xx, 429, idempotency_key_in_use, caller
	// cancellation). Retrying with the SAME idempotency key is safe and is the
	// only correct reaction: the charge may already exist.
	ErrTransient = errors.New("stripe: transient error")
	// ErrCardDeclined: the charge was refused by the card network (402
	// card_error). Permanent for this attempt; nothing was charged.
	ErrCardDeclined = errors.New("stripe: card declined")
	// ErrIdempotencyMismatch: the idempotency key was reused with different
	// parameters (400 idempotency_error). A bug or a key collision: never retry.
	ErrIdempotencyMismatch = errors.New("stripe: idempotency key reused with different parameters")
	// ErrPermission: the key lacks the permission (403), typically a
	// restricted rk_ key without charge write access.
	ErrPermission = errors.New("stripe: permission denied")
	// ErrInvalidRequest: any other 4xx; the request itself is wrong.
	ErrInvalidRequest = errors.New("stripe: invalid request")
	// ErrAuthentication: the key is missing, invalid or revoked (401).
	ErrAuthentication = errors.New("stripe: authentication failed")
	// ErrActionRequired: Stripe needs the customer before it can charge
	// (requires_action: off-session authentication; requires_payment_method:
	// no usable payment method). Nothing was charged; Error.Message says
	// what is needed, Error.PaymentIntentID names the intent.
	ErrActionRequired = errors.New("stripe: customer action required")
)

// Error is the adapter's typed error: the kind (one of the Err* sentinels)
// plus the Stripe fields a caller may need to record. Message is scrubbed of
// anything that looks like an API key.
type Error struct {
	Kind        error
	HTTPStatus  int
	Code        string
	DeclineCode string
	RequestID   string
	Message     string
	// PaymentIntentID and ChargeID name the intent and the (failed) charge
	// Stripe's error carries, when it carries them.
	PaymentIntentID string
	ChargeID        string
	Err             error
}

// Error renders the kind and the Stripe fields; it never includes the key.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
	} else {
		b.WriteString("stripe: error")
	}
	if e.HTTPStatus != 0 {
		fmt.Fprintf(&b, " (status %d", e.HTTPStatus)
		if e.Code != "" {
			fmt.Fprintf(&b, ", code %s", e.Code)
		}
		if e.DeclineCode != "" {
			fmt.Fprintf(&b, ", decline_code %s", e.DeclineCode)
		}
		if e.RequestID != "" {
			fmt.Fprintf(&b, ", request %s", e.RequestID)
		}
		b.WriteString(")")
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Unwrap exposes both the kind and the cause, so errors.Is(err, ErrTransient)
// and errors.Is(err, context.Canceled) both work.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// keyLike matches Stripe secret and restricted keys (and their partially
// masked forms such as sk_test_****1234) wherever they appear in text.
var keyLike = regexp.MustCompile(`\b(?:sk|rk)_[A-Za-z0-9_*]{3,}`)

// scrub removes anything key-like from s (also the partially masked forms
// Stripe prints), then applies pelguard's one redaction function. Stripe
// masks keys in its own messages, but a proxy, a test double or a wrapped net
// error might not.
func scrub(s string) string {
	return redact.String(keyLike.ReplaceAllString(s, redact.Mask))
}

// statusError carries the HTTP status of the last attempt when stripe-go
// could not turn the body into a *stripe.Error (an HTML 502 from a load
// balancer, an empty 500): stripe-go then returns a bare decode error.
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// classify is the ONE place where stripe-go and transport errors become the
// adapter's kinds. nil stays nil.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}

	var se *stripe.Error
	if errors.As(err, &se) {
		se.Msg = scrub(se.Msg)
		out := &Error{
			HTTPStatus:  se.HTTPStatusCode,
			Code:        string(se.Code),
			DeclineCode: string(se.DeclineCode),
			RequestID:   se.RequestID,
			Message:     se.Msg,
			ChargeID:    se.ChargeID,
			Err:         se,
		}
		if se.PaymentIntent != nil {
			out.PaymentIntentID = se.PaymentIntent.ID
		}
		switch {
		case se.Code == stripe.ErrorCodeAuthenticationRequired || se.DeclineCode == stripe.DeclineCodeAuthenticationRequired:
			// Off-session and the bank wants 3-D Secure: only the customer,
			// on-session, can fix it; a retry of the same card fails the same.
			out.Kind = ErrActionRequired
			out.Message = "the customer must authenticate the payment (3-D Secure) on-session: " + se.Msg
		case se.Code == stripe.ErrorCodePaymentIntentUnexpectedState && se.PaymentIntent != nil &&
			se.PaymentIntent.Status == stripe.PaymentIntentStatusRequiresPaymentMethod:
			out.Kind = ErrActionRequired
			out.Message = "the customer has no usable payment method: " + se.Msg
		case se.Type == stripe.ErrorTypeCard:
			out.Kind = ErrCardDeclined
		case se.Code == stripe.ErrorCodeIdempotencyKeyInUse, se.HTTPStatusCode == http.StatusConflict:
			// Another request with the same key is still running: its outcome
			// decides, so this one must be retried later with the same key.
			// Checked before the idempotency_error type: Stripe sends the
			// in-use 409 with that type too, and it is not a mismatch.
			out.Kind = ErrTransient
		case se.Type == stripe.ErrorTypeIdempotency:
			out.Kind = ErrIdempotencyMismatch
		case se.HTTPStatusCode == http.StatusTooManyRequests, se.Code == stripe.ErrorCodeLockTimeout,
			se.Code == stripe.ErrorCodeRateLimit:
			out.Kind = ErrTransient
		case se.HTTPStatusCode >= 500, se.Type == stripe.ErrorTypeAPI:
			out.Kind = ErrTransient
		case se.HTTPStatusCode == http.StatusUnauthorized:
			out.Kind = ErrAuthentication
		case se.HTTPStatusCode == http.StatusForbidden:
			out.Kind = ErrPermission
		case se.HTTPStatusCode == http.StatusPaymentRequired:
			// A 402 that is not a card_error (e.g. a payment-method problem on
			// an intent) is still a refusal, not an unknown outcome.
			out.Kind = ErrCardDeclined
		case se.HTTPStatusCode >= 400:
			out.Kind = ErrInvalidRequest
		default:
			// No status (should not happen): treat as unknown outcome.
			out.Kind = ErrTransient
		}
		return out
	}

	var st *statusError
	if errors.As(err, &st) {
		out := &Error{HTTPStatus: st.status, Message: scrub(st.err.Error()), Err: st.err}
		switch {
		case st.status >= 500, st.status == http.StatusTooManyRequests, st.status == http.StatusConflict:
			out.Kind = ErrTransient
		case st.status == http.StatusUnauthorized:
			out.Kind = ErrAuthentication
		case st.status == http.StatusForbidden:
			out.Kind = ErrPermission
		case st.status >= 400:
			out.Kind = ErrInvalidRequest
		default:
			// A 2xx whose body did not decode: the request may have
			// succeeded, so the outcome is unknown.
			out.Kind = ErrTransient
		}
		return out
	}

	// Everything else is a transport failure (timeout, EOF, connection
	// reset or refused, DNS) or happened after the request may have left
	// (a decode error, the rate limiter giving up on a deadline). The outcome
	// is unknown, so retrying with the same idempotency key is the only safe
	// answer.
	out := &Error{Kind: ErrTransient, Message: scrub(err.Error()), Err: err}
	return out
}

// DeclineClass says what a retry of a declined card can do.
type DeclineClass string

// Decline classes.
const (
	// DeclineSoft: the issuer may accept a later attempt with the same card
	// (insufficient funds, a temporary refusal).
	DeclineSoft DeclineClass = "soft"
	// DeclineHard: no retry of this card can succeed (lost, stolen,
	// fraudulent, closed, invalid): the customer must bring another.
	DeclineHard DeclineClass = "hard"
)

// softDeclines are Stripe's decline codes whose documented next step is
// "retry later" or "the customer can try again" without a new card
// (https://docs.stripe.com/declines/codes). Every other code, and a
// decline without a code, is hard: a retry that card networks count as
// excessive costs more than a late charge, so unknown means "do not retry".
var softDeclines = map[string]bool{
	"insufficient_funds": true, "do_not_honor": true, "try_again_later": true, "generic_decline": true,
	"processing_error": true, "issuer_not_available": true, "reenter_transaction": true,
	"approve_with_id": true, "card_velocity_exceeded": true, "withdrawal_count_limit_exceeded": true,
}

// ClassifyDecline is the class of a card decline_code.
func ClassifyDecline(code string) DeclineClass {
	if softDeclines[code] {
		return DeclineSoft
	}
	return DeclineHard
}

// retryableDebitFailures are bank-debit failure codes a later
// re-presentment can overcome: insufficient funds (ACH R01 / R09, SEPA
// AM04). Closed or unknown accounts and debits the customer disputed as
// unauthorised (R02, R03, R05, R07, R10, SEPA MD01/MD06) must never be
// re-presented.
var retryableDebitFailures = map[string]bool{"insufficient_funds": true}

// MaxDebitRepresentments is how many times a failed debit may be presented
// again: NACHA allows a returned R01/R09 entry to be re-initiated at most
// twice (three presentments in all) within 180 days.
const MaxDebitRepresentments = 2

// DebitRetryable reports whether a failed bank debit with failure code
// code may be presented again.
func DebitRetryable(code string) bool { return retryableDebitFailures[code] }

// ctxError reports the caller's own cancellation as a transient error that
// wraps ctx.Err(), so both errors.Is(err, context.Canceled) and
// errors.Is(err, ErrTransient) hold.
func ctxError(ctx context.Context, op string) error {
	return &Error{Kind: ErrTransient, Message: op + ": " + ctx.Err().Error(), Err: ctx.Err()}
}
