package stripesim

import (
	"cmp"
	"net/http"
	"strings"
)

// SoftDeclineCodes are decline codes a later retry of the same card can
// overcome (the issuer's answer may change: funds arrive, a limit resets).
var SoftDeclineCodes = []string{"insufficient_funds", "do_not_honor", "try_again_later", "generic_decline"}

// HardDeclineCodes are decline codes no retry of the same card overcomes:
// Stripe asks merchants never to retry them.
var HardDeclineCodes = []string{"stolen_card", "lost_card", "fraudulent", "pickup_card"}

// AdviceCodes are the issuer advice codes Stripe sends on a decline
// (Stripe's OpenAPI spec: the enum of charge.outcome.advice_code, and
// api_errors.advice_code; https://docs.stripe.com/declines#retrying-issuer-declines).
var AdviceCodes = []string{"confirm_card_data", "do_not_try_again", "try_again_later"}

// PMProcessingError is Stripe's test payment method of card
// 4000000000000119: its charges fail 402 card_error with code
// processing_error and no decline_code.
const PMProcessingError = "pm_card_chargeDeclinedProcessingError"

// DebitFailureCodes are the failure codes Settle is typically given for a
// failed bank debit (ACH return codes R01, R02/R03, R10 and their SEPA
// equivalents, as Stripe names them).
var DebitFailureCodes = []string{"insufficient_funds", "account_closed", "no_account", "debit_not_authorized"}

// outcomeKind is what a confirm or a charge create does for one payer.
type outcomeKind int

const (
	outSucceeded       outcomeKind = iota
	outPending                     // bank debit: processing intent, pending charge
	outDeclined                    // 402 card_declined with declineCode
	outAuthRequired                // the bank asks for 3-D Secure
	outNoPaymentMethod             // nothing to charge
)

type outcome struct {
	kind        outcomeKind
	declineCode string
	// errCode is the card_error's code: card_declined (with declineCode),
	// authentication_required, or one Stripe sends without a decline_code
	// (processing_error, expired_card, …).
	errCode    string
	adviceCode string
}

// outcomeFor decides from the active faults, looking up the customer and
// then the payment method. The most blocking fault wins: no payment method,
// then authentication, then a decline, then a debit.
func (a *activeFaults) outcomeFor(customer, paymentMethod string) outcome {
	has := func(m map[string]bool) bool {
		return (customer != "" && m[customer]) || (paymentMethod != "" && m[paymentMethod])
	}
	code := func() string {
		if c := a.DeclineCodes[customer]; customer != "" && c != "" {
			return c
		}
		if paymentMethod != "" {
			return a.DeclineCodes[paymentMethod]
		}
		return ""
	}
	lookup := func(m map[string]string) string {
		if c := m[customer]; customer != "" && c != "" {
			return c
		}
		if paymentMethod != "" {
			return m[paymentMethod]
		}
		return ""
	}
	advice := lookup(a.AdviceCodes)
	switch {
	case customer != "" && a.noPM[customer] && paymentMethod == "":
		return outcome{kind: outNoPaymentMethod}
	case has(a.authRequired):
		return outcome{kind: outAuthRequired, declineCode: "authentication_required", errCode: "authentication_required"}
	case code() != "":
		return outcome{kind: outDeclined, declineCode: code(), errCode: "card_declined", adviceCode: advice}
	case lookup(a.CardErrorCodes) != "":
		return outcome{kind: outDeclined, errCode: lookup(a.CardErrorCodes), adviceCode: advice}
	case paymentMethod == PMProcessingError:
		return outcome{kind: outDeclined, errCode: "processing_error", adviceCode: advice}
	case has(a.declines):
		return outcome{kind: outDeclined, declineCode: "generic_decline", errCode: "card_declined", adviceCode: advice}
	case has(a.debits):
		return outcome{kind: outPending}
	}
	return outcome{kind: outSucceeded}
}

// declineMessage is the customer-facing message Stripe sends for a code.
// Stripe hides lost, stolen and fraud codes behind the generic message so a
// fraudster learns nothing; the decline_code still tells the merchant.
func declineMessage(code string) string {
	switch code {
	case "insufficient_funds":
		return "Your card has insufficient funds."
	case "authentication_required":
		return "Your card was declined. This transaction requires authentication."
	case "processing_error":
		return "An error occurred while processing your card. Try again in a little bit."
	case "expired_card":
		return "Your card has expired."
	case "incorrect_cvc":
		return "Your card's security code is incorrect."
	}
	return "Your card was declined."
}

// cardError is the card_error Stripe answers for a declined outcome, as
// the 402's error and the intent's last_payment_error.
func (oc outcome) cardError(chargeID string) stripeError {
	return stripeError{
		Type: "card_error", Code: oc.errCode, DeclineCode: oc.declineCode, AdviceCode: oc.adviceCode,
		Message: declineMessage(cmp.Or(oc.declineCode, oc.errCode)), Charge: chargeID,
		DocURL: "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(oc.errCode, "_", "-"),
	}
}

// debitFailureMessage is the failure_message of a failed bank debit.
func debitFailureMessage(code string) string {
	switch code {
	case "insufficient_funds":
		return "The customer's account has insufficient funds to cover this payment."
	case "account_closed":
		return "The customer's bank account has been closed."
	case "no_account":
		return "The customer's bank account could not be located."
	case "debit_not_authorized":
		return "The customer has notified their bank that this payment was unauthorized."
	}
	return "The customer's bank could not process this payment."
}

// declinedErr is Stripe's 402 for a card decline. It is cached: the request
// executed, and Stripe replays it for the same key for 24 h.
func declinedErr(oc outcome, chargeID string, intent any) response {
	e := oc.cardError(chargeID)
	e.PaymentIntent = intent
	resp := errorResp(http.StatusPaymentRequired, e)
	resp.cache = true
	return resp
}
