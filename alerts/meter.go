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
			"Do not send it again by hand: Stripe may already count it. Look it up by identifier among the customer's meter events at Stripe, "+
			"then record what you found with `pelguard-consumer meter-settle --identifier ID --event-ts TS --counted|--not-counted --reason WHY`; "+
			"the event is in the dead-letter stream (reason `meter_event_parked`).",
			code(identifier), code(stripeCustomerID), value, code(eventName), Escape(reason)),
		Fingerprint: "meter_event_parked:" + identifier,
	}
}

// MeterCapReached reports a meter event that was not sent because it would
// pass the meter's spend cap for its customer and month (used and the cap
// in the cap's unit: "units" or "events"). Repeats for the same meter,
// customer, month and cap are deduplicated: the other events are in the
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
		Fingerprint: fmt.Sprintf("spend_cap:meter:%s:%s:%s:%d", eventName, stripeCustomerID, month, capValue),
	}
}

// KindMeterMissing: Stripe has no active meter for a usage event's
// event_name, so every such event is refused and dead-lettered
// (meter_event_refused) until the meter exists. Sent once per event name
// and process, at the first refusal.
const KindMeterMissing Kind = "meter_missing"

// MeterMissing reports the first event refused for want of a meter: which
// event name, how to create the meter (at Stripe and in the emulator, the
// same API call) and how to replay what was refused meanwhile.
func MeterMissing(eventName, stream string) Alert {
	return Alert{
		Kind:  KindMeterMissing,
		Title: "No Stripe meter for event name " + eventName,
		Text: fmt.Sprintf("Stripe has no active meter for event_name %s: every %s event on %s is refused and "+
			"dead-lettered (reason `meter_event_refused`), nothing is counted, until the meter exists.\n"+
			"Create it in Stripe's Dashboard (Billing → Meters → Create meter, event name %s), or with the API, "+
			"which the emulator (stripesim) answers too: "+
			"`curl $STRIPE_API_BASE/v1/billing/meters -u $STRIPE_API_KEY: -d display_name=%s -d event_name=%s -d 'default_aggregation[formula]=sum'`.\n"+
			"Then replay the refused events: `"+cmdname.Consumer+" replay --stream %s --reason meter_event_refused`.",
			code(eventName), Escape(eventName), code(stream), code(eventName), eventName, eventName, stream),
		Fields:      []Field{{Label: "Event name", Value: eventName}, {Label: "Stream", Value: stream}},
		Fingerprint: "meter_missing:" + eventName,
	}
}
