package reaper

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/ledger"
)

// decideInput is everything decideEntry looks at for one pending entry,
// gathered by fetch. New inputs (a consumer-liveness registry, a ledger
// that is a team's own table) are new fields; a zero field must keep
// today's decision.
type decideInput struct {
	// Pending is the entry's XPENDING line: id, owner, idle time, delivery
	// count.
	Pending redis.XPendingExt
	// InFlight: this reaper is re-driving the entry right now. Nothing else
	// is needed (or fetched) to decide it.
	InFlight bool
	// Gone: XRANGE did not return the body (trimmed or deleted).
	Gone bool
	// Fields is the body, as go-redis returns it; nil when Gone.
	Fields map[string]any
	// RowKey is the key the ledger was asked about for this entry (the
	// payload's quick reading; zero when it had none), and Row its row;
	// HasRow is false when the ledger has none. (A value, not a pointer:
	// a pointer costs the pass a heap copy of every row.)
	RowKey ledger.Key
	Row    ledger.Record
	HasRow bool
	// Now judges ledger leases.
	Now time.Time
	// OwnerUnknown: the entry's owner never registered as a pelguard
	// consumer and is not among Config.StoppedConsumers.
	OwnerUnknown bool
}

// decideConfig is the part of Config a decision depends on.
type decideConfig struct {
	MaxDeliveries int64
	Rules         event.Rules
	// Imported are the periods `consumer import` has run for: their old
	// consumers are known to be stopped (the runbook stops them first).
	Imported map[string]bool
	// External: the rows are a team's own table (Config.ExternalLedger),
	// holding only the key, a charge id and the team's status.
	External bool
}

func (r *Reaper) decideConfig() decideConfig {
	return decideConfig{MaxDeliveries: r.cfg.MaxDeliveries, Rules: r.cfg.Rules, Imported: r.imported, External: r.team != nil}
}

// verdict is decideEntry's answer: a Kind and what act needs to carry it out
// and account for it.
type verdict struct {
	Kind   Kind
	Key    string // customer_id/billing_period, when the body parsed
	Reason string // Decision.Reason: dead-letter reason, ledger status, why
	Detail string // the dead letter's detail
	// NeedRow is not a decision: the payload names Lookup, not RowKey (the
	// quick reading got it wrong or found nothing). Never decide on the
	// wrong row: ask the ledger for Lookup and decide again.
	NeedRow bool
	Lookup  ledger.Key
}

// decideEntry is the reaper's decision table (DESIGN.md "Reaper, per pass",
// step 3), checked in order. It is pure: no Redis, no Postgres, no clock
// (in.Now), so every kind it returns is table-tested without services
// (decide_test.go). The kinds it cannot return come from I/O outcomes in
// act: KindRedriven, KindClaimLost, KindError.
func decideEntry(cfg decideConfig, in decideInput) verdict {
	pe := in.Pending
	switch {
	case in.InFlight:
		return verdict{Kind: KindInFlight}
	case in.Gone:
		return verdict{Kind: KindGone}
	}
	rec, hasRow := &in.Row, in.HasRow
	var ev event.Event
	if !cfg.External && hasRow && rec.Status.Terminal() && in.Fields[event.PayloadField] == rowEvent(*rec).Payload() {
		// Most of a large PEL is usually already billed, and full validation
		// costs more than everything else in a page: a payload byte for byte
		// the canonical form of a terminal row's event is that (valid) event.
		ev = rowEvent(*rec)
	} else {
		parsed, err := event.ParseFields(in.Fields, cfg.Rules)
		if err != nil {
			var rej *event.RejectError
			if !errors.As(err, &rej) {
				rej = &event.RejectError{Reason: event.ReasonNotJSON, Detail: err.Error()}
			}
			return verdict{Kind: KindInvalid, Reason: rej.Reason, Detail: rej.Error()}
		}
		ev = parsed
		if k := ledger.EventKey(ev); k != in.RowKey {
			return verdict{NeedRow: true, Lookup: k}
		}
	}
	v := verdict{Key: ledger.EventKey(ev).String()}
	switch {
	case in.OwnerUnknown && !cfg.Imported[ev.BillingPeriod]:
		// A consumer without a heartbeat: inside a slow Stripe call or
		// dead, nobody can tell. Never touch its entries ("reclaim while in
		// flight") until an operator says it is stopped.
		v.Kind = KindUnregistered
		v.Reason = "owner " + pe.Consumer + " never registered as a pelguard consumer; name it in --stopped-consumers once it is stopped, or run `" + cmdname.Consumer + " import` for " + ev.BillingPeriod
	case cfg.External && hasRow && externalBilled(*rec):
		// The team billed it (charged, or a terminal status such as
		// card_declined) and left it unacked: ack, no Stripe call.
		v.Kind, v.Reason = KindAlreadyBilled, "team's table: "+string(rec.Status)
	case cfg.External && hasRow:
		// A row without a charge and without a terminal status: a shape of
		// the team's own (a pending row); its consumer decides, not us.
		v.Kind = KindLeaseLive
		v.Reason = "the team's table has status " + string(rec.Status) + " without a charge; left to the team's consumer"
	case hasRow && rec.Status.Terminal() && !reopens(*rec, in.Fields):
		if rec.StripeCustomerID != ev.StripeCustomerID || rec.AmountCents != ev.AmountCents || rec.Currency != ev.Currency {
			// A different charge for a billed customer and period: never
			// charge it, never drop it silently either (invariant 2).
			v.Kind, v.Reason = KindConflict, consumer.ReasonConflict
			v.Detail = fmt.Sprintf("the ledger has %s for %s with %d %s for %s; this event says %d %s for %s",
				rec.Status, rec.Key, rec.AmountCents, rec.Currency, rec.StripeCustomerID,
				ev.AmountCents, ev.Currency, ev.StripeCustomerID)
			return v
		}
		// Already billed (partial batch, killed before XACK, AOF rollback):
		// ack, never redeliver (invariant 5).
		v.Kind, v.Reason = KindAlreadyBilled, string(rec.Status)
	case hasRow && rec.LeaseLive(in.Now):
		// Reclaim while in flight: slow, not dead. Never claim it.
		v.Kind = KindLeaseLive
		v.Reason = fmt.Sprintf("lease held by %s until %s", rec.LeaseOwner, rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano))
	case pe.RetryCount >= cfg.MaxDeliveries:
		v.Kind, v.Reason = KindMaxDeliveries, consumer.ReasonMaxDelivery
		v.Detail = fmt.Sprintf("delivered %d times (max %d); last owner %s, idle %s",
			pe.RetryCount, cfg.MaxDeliveries, pe.Consumer, pe.Idle)
	default:
		v.Kind = KindClaim
	}
	return v
}

// rowEvent is the event a ledger row was created from.
func rowEvent(rec ledger.Record) event.Event {
	return event.Event{CustomerID: rec.CustomerID, StripeCustomerID: rec.StripeCustomerID,
		AmountCents: rec.AmountCents, BillingPeriod: rec.BillingPeriod, Currency: rec.Currency}
}

// reopens reports an entry that charges its row again: a replayed dead
// letter of a row whose last attempt failed finally (the runbook's "fix,
// then replay"). It is re-driven like a pending row, never acked unbilled.
func reopens(rec ledger.Record, fields map[string]any) bool {
	return consumer.IsReplay(fields) && rec.Status.Reopenable()
}
