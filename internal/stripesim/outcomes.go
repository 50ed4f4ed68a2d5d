package stripesim

import "net/http"

// SoftDeclineCodes are decline codes a later retry of the same card can
// overcome (the issuer's answer may change: funds arrive, a limit resets).
var SoftDeclineCodes = []string{"insufficient_funds", "do_not_honor", "try_again_later", "generic_decline"}

// HardDeclineCodes are decline codes no retry of the same card overcomes:
// Stripe asks merchants never to retry them.
var HardDeclineCodes = []string{"stolen_card", "lost_card", "fraudulent", "pickup_card"}

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
	switch {
	case customer != "" && a.noPM[customer] && paymentMethod == "":
		return outcome{kind: outNoPaymentMethod}
	case has(a.authRequired):
		return outcome{kind: outAuthRequired, declineCode: "authentication_required"}
	case code() != "":
		return outcome{kind: outDeclined, declineCode: code()}
	case has(a.declines):
		return outcome{kind: outDeclined, declineCode: "generic_decline"}
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
	}
	return "Your card was declined."
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
func declinedErr(code, chargeID string, intent any) response {
	e := stripeError{
		Type: "card_error", Code: "card_declined", DeclineCode: code,
		Message: declineMessage(code), Charge: chargeID, PaymentIntent: intent,
		DocURL: "https://stripe.com/docs/error-codes/card-declined",
	}
	if code == "authentication_required" {
		e.Code = "authentication_required"
		e.DocURL = "https://stripe.com/docs/error-codes/authentication-required"
	}
	resp := errorResp(http.StatusPaymentRequired, e)
	resp.cache = true
	return resp
}
