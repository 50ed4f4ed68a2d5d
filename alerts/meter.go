package alerts

import "fmt"

// KindMeterEventParked: a meter event whose outcome is unknown (or that
// Stripe answered in a way pelguard cannot settle) is not re-sent: Stripe
// may no longer guard its identifier, and sending it again could count it
// twice. A person decides.
const KindMeterEventParked Kind = "meter_event_parked"

// MeterEventParked reports one parked meter event.
func MeterEventParked(eventName, stripeCustomerID, identifier string, value int64, reason string) Alert {
	return Alert{
		Kind:  KindMeterEventParked,
		Title: "Meter event parked: not re-sent",
		Text: fmt.Sprintf("The meter event %s of %s (value %d) for meter %s is not sent again: %s\n"+
			"Check the customer's meter at Stripe; the event is in the dead-letter stream (reason `meter_event_parked`).",
			code(identifier), code(stripeCustomerID), value, code(eventName), Escape(reason)),
		Fingerprint: "meter_event_parked:" + identifier,
	}
}
