package stripeapi

import (
	"context"
	"encoding/json"
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
	// ErrDuplicateIdentifier: Stripe refused a meter event because an
	// event with its identifier already exists (400). Stripe deduplicates
	// identifiers within a rolling window of at least 24 hours, so the
	// event was delivered by an earlier call: callers record it as
	// delivered, never send it again under another identifier.
	ErrDuplicateIdentifier = errors.New("stripe: meter event identifier already used")
)

// Error is the adapter's typed error: the kind (one of the Err* sentinels)
// plus the Stripe fields a caller may need to record. Message is scrubbed of
// anything that looks like an API key.
type Error struct {
	Kind        error
	HTTPStatus  int
	Code        string
	DeclineCode string
	// AdviceCode is the issuer's advice on a decline (do_not_try_again,
	// try_again_later, confirm_card_data), read from the raw body: stripe-go
	// v76's Error has no field for it.
	AdviceCode string
	RequestID  string
	Message    string
	// Param is the parameter Stripe's error names, e.g. "timestamp" or
	// "payload[value]" for a refused meter event.
	Param string
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
		if e.AdviceCode != "" {
			fmt.Fprintf(&b, ", advice_code %s", e.AdviceCode)
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
	if errors.As(err, &se) && !fromStripe(se) {
		// Not Stripe's error body (a proxy's JSON with an "error" object but
		// none of Stripe's fields): judged by its status like any other
		// answer that is not Stripe's.
		err = &statusError{status: se.HTTPStatusCode, err: errors.New(scrub(se.Msg))}
		se = nil
	}
	if se != nil {
		se.Msg = scrub(se.Msg)
		out := &Error{
			HTTPStatus:  se.HTTPStatusCode,
			Code:        string(se.Code),
			DeclineCode: string(se.DeclineCode),
			AdviceCode:  adviceCode(se),
			RequestID:   se.RequestID,
			Message:     se.Msg,
			Param:       se.Param,
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
		case se.Type == stripe.ErrorTypeCard && out.AdviceCode == AdviceConfirmCardData:
			// The issuer says the card's data (number, expiry, CVC,
			// address) is wrong: the same card fails the same way until
			// the customer corrects it, as with authentication.
			out.Kind = ErrActionRequired
			out.Message = "the customer must confirm or update the card's details (issuer advice confirm_card_data): " + se.Msg
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
		// An answer that is not a Stripe error body (an HTML 403/404/413
		// from a load balancer, WAF or corporate proxy, a bare JSON without
		// Stripe's error object, an empty 502, a 2xx that did not decode).
		// Whoever sent it, the request may have reached Stripe before it
		// (a proxy that rejects the response, a gateway that timed out
		// after forwarding), so the outcome is unknown whatever the status:
		// retry with the same key, never record a permanent failure that
		// would move on to a new key. Only Stripe's own bodies, classified
		// above, say that nothing was charged.
		return &Error{Kind: ErrTransient, HTTPStatus: st.status, Err: st.err,
			Message: fmt.Sprintf("status %d without a Stripe error body (a proxy or load balancer answered?); outcome unknown: %s",
				st.status, scrub(st.err.Error()))}
	}

	// Everything else is a transport failure (timeout, EOF, connection
	// reset or refused, DNS) or happened after the request may have left
	// (a decode error, the rate limiter giving up on a deadline). The outcome
	// is unknown, so retrying with the same idempotency key is the only safe
	// answer.
	out := &Error{Kind: ErrTransient, Message: scrub(err.Error()), Err: err}
	return out
}

// meterEventError tells a meter event's duplicate identifier apart from
// its other refusals, and leaves every other error to classify (through
// Client.call), as it is. Stripe refuses a duplicate with a 400
// invalid_request_error and no code, and the message, reported by users
// ("An event already exists with identifier <id>."), is not documented.
// It is matched loosely (case aside, "identifier" and "already exists" or
// "already been used") so a rewording keeps working; a refusal it misses
// stays ErrInvalidRequest, which callers dead-letter: visible, never a
// second delivery.
func meterEventError(err error) error {
	var se *stripe.Error
	if !errors.As(err, &se) || !fromStripe(se) || se.HTTPStatusCode != http.StatusBadRequest ||
		se.Type != stripe.ErrorTypeInvalidRequest || !duplicateIdentifierMessage(se.Msg) {
		return err
	}
	return &Error{Kind: ErrDuplicateIdentifier, HTTPStatus: se.HTTPStatusCode, Code: string(se.Code), Param: se.Param,
		RequestID: se.RequestID, Message: scrub(se.Msg), Err: se}
}

func duplicateIdentifierMessage(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "identifier") && (strings.Contains(m, "already exists") || strings.Contains(m, "already been used"))
}

// DeclineClass says what a retry of a declined card can do.
type DeclineClass string

// Decline classes.
const (
	// DeclineNone: the error is not a refusal of the payment (nil, a
	// transient error, an invalid request, …).
	DeclineNone DeclineClass = ""
	// DeclineSoft: the issuer may accept a later attempt with the same card
	// (insufficient funds, a temporary refusal, a processing error).
	DeclineSoft DeclineClass = "soft"
	// DeclineHard: no retry of this card can succeed (lost, stolen,
	// fraudulent, closed, invalid, or the issuer said do_not_try_again):
	// the customer must bring another.
	DeclineHard DeclineClass = "hard"
	// DeclineAction: only the customer can fix it, with the same card
	// (authenticate on-session, confirm the card's details); the error's
	// kind is ErrActionRequired and its Message says what is needed.
	DeclineAction DeclineClass = "action"
)

// Stripe's advice codes (api_errors.advice_code; the values are the enum of
// charge.outcome.advice_code). https://docs.stripe.com/declines#retrying-issuer-declines
const (
	AdviceDoNotTryAgain   = "do_not_try_again"
	AdviceTryAgainLater   = "try_again_later"
	AdviceConfirmCardData = "confirm_card_data"
)

// softDeclines are Stripe's decline codes whose documented next step is
// "retry later" or "the customer can try again" without a new card
// (https://docs.stripe.com/declines/codes). Every other code, and a
// decline without a code, is hard: a retry that card networks count as
// excessive costs more than a late charge, so unknown means "do not retry".
// The same names are looked up whether Stripe sends them as decline_code
// or, without one, as the error's code (processing_error, test card
// 4000000000000119).
var softDeclines = map[string]bool{
	"insufficient_funds": true, "do_not_honor": true, "try_again_later": true, "generic_decline": true,
	"processing_error": true, "issuer_not_available": true, "reenter_transaction": true,
	"approve_with_id": true, "card_velocity_exceeded": true, "withdrawal_count_limit_exceeded": true,
}

// neverRetry are decline codes no advice makes retryable: the card is
// reported lost or stolen, or the payment fraudulent. Stripe: "don't
// report more detailed information to your customer" and do not retry
// (https://docs.stripe.com/declines/codes); card networks forbid
// reattempts on them.
var neverRetry = map[string]bool{"lost_card": true, "stolen_card": true, "pickup_card": true, "fraudulent": true}

// ClassifyDecline is the class of a card decline_code alone. Prefer
// DeclineClassOf(err), which also reads the error's code and the issuer's
// advice_code.
func ClassifyDecline(code string) DeclineClass {
	if softDeclines[code] {
		return DeclineSoft
	}
	return DeclineHard
}

// DeclineClassOf is the decline class of an error returned by Client:
// what the next attempt of the same card can do. It is the one decision
// for a declined charge; callers must not read DeclineCode alone.
//
//   - ErrActionRequired (authentication_required, advice confirm_card_data):
//     DeclineAction.
//   - ErrCardDeclined: advice_code first, as Stripe documents it
//     (https://docs.stripe.com/declines#retrying-issuer-declines):
//     do_not_try_again is hard, try_again_later soft (unless the code says
//     lost, stolen or fraudulent); without advice, the decline_code or,
//     when Stripe sends none, the error's own code (processing_error,
//     expired_card, incorrect_cvc, …) through the soft list.
//   - anything else: DeclineNone.
func DeclineClassOf(err error) DeclineClass {
	var e *Error
	if !errors.As(err, &e) {
		return DeclineNone
	}
	return e.DeclineClass()
}

// DeclineClass is DeclineClassOf(e).
func (e *Error) DeclineClass() DeclineClass {
	switch {
	case e == nil:
		return DeclineNone
	case errors.Is(e.Kind, ErrActionRequired):
		return DeclineAction
	case !errors.Is(e.Kind, ErrCardDeclined):
		return DeclineNone
	}
	code := e.FailureCode()
	switch {
	case e.AdviceCode == AdviceDoNotTryAgain, neverRetry[code]:
		return DeclineHard
	case e.AdviceCode == AdviceTryAgainLater:
		return DeclineSoft
	}
	return ClassifyDecline(code)
}

// FailureCode is the most specific reason Stripe gave for a refusal: the
// decline_code, else the error's code (card_declined without a reason,
// processing_error, expired_card, …). Record and alert with it.
func (e *Error) FailureCode() string {
	if e == nil {
		return ""
	}
	if e.DeclineCode != "" {
		return e.DeclineCode
	}
	return e.Code // card_declined without a reason (hard), processing_error, …
}

// fromStripe reports whether se is Stripe's own error body: Stripe always
// sends the error's type (https://docs.stripe.com/api/errors: "type: The
// type of error returned. One of api_error, card_error, idempotency_error,
// or invalid_request_error"). stripe-go also turns a proxy's JSON that
// happens to hold an "error" object into a *stripe.Error; that one has no
// type.
func fromStripe(se *stripe.Error) bool { return se.Type != "" }

// adviceCode reads error.advice_code from the raw body stripe-go keeps on
// the error (LastResponse.RawJSON): stripe-go v76's Error has no field for
// it. "" when absent or unreadable.
func adviceCode(se *stripe.Error) string {
	if se.LastResponse == nil || len(se.LastResponse.RawJSON) == 0 {
		return ""
	}
	var body struct {
		Error struct {
			AdviceCode string `json:"advice_code"`
		} `json:"error"`
	}
	if json.Unmarshal(se.LastResponse.RawJSON, &body) != nil {
		return ""
	}
	return body.Error.AdviceCode
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
