package alerts

import (
	"fmt"

	"github.com/pelguard/pelguard/internal/cmdname"
)

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

// MeterCapReached reports a meter event that was not sent because it would
// pass the meter's spend cap for its customer and month (used and the cap
// in the cap's unit: "units" or "events"). Repeats for the same meter,
// customer and month are deduplicated: the other events are in the
// dead-letter stream with reason spend_cap.
func MeterCapReached(eventName, stripeCustomerID, month string, capValue, used int64, unit string, value int64, stream string) Alert {
	return Alert{
		Kind:  KindSpendCap,
		Title: fmt.Sprintf("Meter cap reached: %s of %s in %s", eventName, stripeCustomerID, month),
		Text: fmt.Sprintf("A meter event of value %d for %s was *not sent*: it would pass the cap. "+
			"It is dead-lettered with reason `spend_cap`; raise the cap (`"+cmdname.Consumer+" meter-cap set`), then `"+cmdname.Consumer+" replay --stream %s --reason spend_cap`.",
			value, code(stripeCustomerID), Escape(stream)),
		Fields: []Field{
			{Label: "Meter", Value: eventName},
			{Label: "Customer", Value: stripeCustomerID},
			{Label: "Month", Value: month},
			{Label: "Cap", Value: fmt.Sprintf("%d %s", capValue, unit)},
			{Label: "Used", Value: fmt.Sprintf("%d %s", used, unit)},
		},
		Fingerprint: "spend_cap:meter:" + eventName + ":" + stripeCustomerID + ":" + month,
	}
}
