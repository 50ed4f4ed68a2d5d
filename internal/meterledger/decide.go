package meterledger

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/pelguard/pelguard/event"
)

// Decision is what Reserve decided for one event.
type Decision int

const (
	// Acquired: a new row (sending, epoch above the floor) and the
	// customer's meter slot are the caller's: send the event.
	Acquired Decision = iota + 1
	// TakenOver: the row's last holder left it with an unknown outcome
	// (lease expired or released) within the safe window of its first
	// attempt: the caller holds a new epoch and the slot, and sends again
	// under the same identifier (Stripe refuses it as a duplicate if the
	// first attempt got through: record that as delivered).
	TakenOver
	// AlreadyDelivered: recorded as delivered: ack, never send (any age).
	AlreadyDelivered
	// AlreadyTerminal: parked or failed before: not sent; ack (the row
	// says why, and the first time was alerted or dead-lettered), or,
	// for a row left to a person (Record.LeftToAPerson), dead-letter it
	// again so that they can settle and replay it.
	AlreadyTerminal
	// Busy: another holder has a live lease on the row (or another copy of
	// the event in this batch is being sent, or the row changed while this
	// call decided): leave the entry pending.
	Busy
	// SlotBusy: another event of the same customer and meter is in flight
	// (Stripe allows one concurrent call per customer per meter): leave the
	// entry pending and try again shortly.
	SlotBusy
	// Parked: this call parked the row: its outcome is unknown and Stripe
	// may no longer guard its identifier (past the safe window of its first
	// attempt), or Stripe would refuse its timestamp. Not sent; alert and
	// ack. A person decides (Record.LastError says why).
	Parked
	// Held: the ledger is suspect (a rollback not yet repaired may have
	// lost delivered rows) and the event, new to the ledger, is older than
	// the safe window: it may be a lost delivered row that Stripe no longer
	// guards. Nothing is written and nothing sent: leave the entry pending
	// (or dead-letter it for a replay). The repair parks it if its entry
	// was not acked when the loss was found (it may have been counted
	// more than Stripe's identifier window ago); otherwise, delivered again
	// once the rollback is repaired, it is sent: a real backfill is
	// counted then.
	Held
	// OutsideWindow: no row, and Stripe would refuse the timestamp (older
	// than 35 days, or more than 5 minutes ahead): dead-letter it.
	OutsideWindow
	// Conflict: a row with this identifier records another meter, customer
	// or value (an event id re-used for another event): not the event
	// that was sent; dead-letter it for a human.
	Conflict
	// Reopened: an operator's replay (Request.Replay) of an event recorded
	// failed (Stripe refused it) or parked (outcome unknown past the safe
	// window): the row is sent again, with the replay's fields, under a new
	// epoch and the slot, its safe window starting now. For a parked event
	// the replay is the person's word that Stripe does not have it.
	Reopened
	// ReplayRefused: an operator's replay of an event Stripe may have
	// counted (parked, or failed after an attempt of unknown outcome, and
	// not settled) whose first attempt is past the safe window: Stripe may
	// no longer refuse its identifier, so a re-send could count it twice.
	// Nothing written, nothing sent: dead-letter it again. A person checks
	// at Stripe and settles it, or replays with an override (Request.Override).
	ReplayRefused
	// Queued: Ingest recorded a new event (or a replay reopened one): its
	// entry may be acked; a sender sends it from the ledger.
	Queued
	// InLedger: Ingest found the event already recorded, queued or sending:
	// ack the entry; the senders finish it.
	InLedger
	// OverCap: the event would pass the meter's spend cap for its customer
	// and month (meter_caps): nothing written, nothing sent. Dead-letter it
	// (reason spend_cap) with an alert; once the cap is raised, a replay
	// sends it. Claim.Cap says which cap and how much was used.
	OverCap
)

var decisionNames = map[Decision]string{Acquired: "acquired", TakenOver: "taken_over", AlreadyDelivered: "already_delivered",
	AlreadyTerminal: "already_terminal", Busy: "busy", SlotBusy: "slot_busy", Parked: "parked", Held: "held",
	OutsideWindow: "outside_window", Conflict: "conflict", Reopened: "reopened", OverCap: "over_cap",
	ReplayRefused: "replay_refused", Queued: "queued", InLedger: "in_ledger"}

func (d Decision) String() string {
	if s, ok := decisionNames[d]; ok {
		return s
	}
	return fmt.Sprintf("decision(%d)", int(d))
}

// MaySend reports whether the caller now holds the lease and the slot.
func (d Decision) MaySend() bool { return d == Acquired || d == TakenOver || d == Reopened }

// Request asks to send one event.
type Request struct {
	Event      event.MeterEvent
	Identifier string        // Event.Identifier(namespace)
	Owner      string        // consumer name; recorded for operators
	Lease      time.Duration // lease and slot last this long without a heartbeat
	MessageID  string        // stream entry id, for operators only
	// Suspect: the ledger may have lost rows (consumer.LedgerWitness.Suspect()):
	// a new event older than the safe window is Held, not sent.
	Suspect bool
	// Replay: the entry is an operator's replay of a dead letter: a failed
	// or parked row is Reopened rather than acked.
	Replay bool
	// Override: with Replay, the operator's word (who, when, why) that an
	// event Stripe may have counted does not count there: it is reopened
	// past the safe window (recorded on the row, replay_override).
	Override string
}

// Claim is Reserve's answer for one request.
type Claim struct {
	Decision Decision
	// Record is the row as it now stands (zero when there is none: Held,
	// OutsideWindow, SlotBusy or Busy on a new event).
	Record Record
	// Reason explains Parked, Held, OutsideWindow, Conflict, OverCap, Busy
	// and SlotBusy.
	Reason string
	// Cap is the cap that refused the event and the customer's use of the
	// meter that month (OverCap only).
	Cap       CapState
	slotToken int64
}

// Hold is what a holder presents to Finish and ExtendMany: the row's epoch
// and owner, and the slot's grant.
type Hold struct {
	Key
	StripeCustomerID string
	EventName        string
	Epoch            int64
	Owner            string
	SlotToken        int64
}

// Hold is the claim's hold (meaningful when Decision.MaySend).
func (c Claim) Hold() Hold {
	r := c.Record
	return Hold{Key: r.Key, StripeCustomerID: r.StripeCustomerID, EventName: r.EventName, Epoch: r.Epoch,
		Owner: r.LeaseOwner, SlotToken: c.slotToken}
}

// slot is a meter_inflight row as Reserve read it (token 0: none).
type slot struct {
	Identifier string
	Owner      string
	ExpiresAt  time.Time
	Token      int64
}

// decideRow decides from the event's row alone (nil: none), at now.
func decideRow(now time.Time, safe time.Duration, req Request, key Key, row *Record) (Decision, string) {
	ev := req.Event
	stripeTakes := event.MeterTimestampOK(key.EventTS, now)
	if row == nil {
		switch {
		case !stripeTakes:
			return OutsideWindow, fmt.Sprintf("timestamp %s is outside what Stripe takes at %s (35 days old to 5 minutes ahead): not sent",
				key.EventTS.Format(time.RFC3339), now.Format(time.RFC3339))
		case req.Suspect && now.Sub(key.EventTS) >= safe:
			return Held, fmt.Sprintf("the ledger may have lost rows (unrepaired rollback) and the event is %s old, past the safe window: "+
				"it may have been delivered more than Stripe's identifier window ago; not sent until the rollback is repaired", now.Sub(key.EventTS).Round(time.Minute))
		}
		return Acquired, ""
	}
	switch {
	case req.Replay && (row.Status == StatusFailed || row.Status == StatusParked) && stripeTakes &&
		row.MaybeCounted() && req.Override == "" && now.Sub(row.FirstSentAt) >= safe:
		return ReplayRefused, fmt.Sprintf("Stripe may count this event (%s: %s) and no longer guards its identifier (first attempt %s, %s ago): "+
			"a replay could count it twice. Check the meter's events at Stripe, then settle it (pelguard-consumer meter-settle), "+
			"or replay with --override \"why\" if Stripe does not have it",
			row.Status, row.LastError, row.FirstSentAt.Format(time.RFC3339), now.Sub(row.FirstSentAt).Round(time.Minute))
	case req.Replay && (row.Status == StatusFailed || row.Status == StatusParked) && stripeTakes:
		return Reopened, ""
	case row.EventName != ev.EventName || row.StripeCustomerID != ev.StripeCustomerID || row.Value != ev.Value:
		// Before the terminal states: acking another event as "already
		// delivered" would drop it silently.
		return Conflict, fmt.Sprintf("identifier %s was recorded for %s/%s value %d, this event is %s/%s value %d",
			key.Identifier, row.EventName, row.StripeCustomerID, row.Value, ev.EventName, ev.StripeCustomerID, ev.Value)
	case row.Status == StatusDelivered:
		return AlreadyDelivered, ""
	case row.Status == StatusQueued && row.OutcomeUnknown && now.Sub(row.FirstSentAt) >= safe:
		// A replay of an event Stripe may have (with its override, or a
		// row restored by the usage repair): its window has run out.
		return Parked, fmt.Sprintf("unknown outcome older than Stripe's identifier window: not re-sent (first attempt %s, %s ago)",
			row.FirstSentAt.Format(time.RFC3339), now.Sub(row.FirstSentAt).Round(time.Minute))
	case row.Status == StatusQueued:
		return Acquired, "" // sent from the ledger: Reserve moves it to sending (opDequeue)
	case row.Status != StatusSending:
		return AlreadyTerminal, row.LastError
	case row.LeaseLive(now):
		// Even for our own name: a pinned name may run twice by mistake.
		return Busy, fmt.Sprintf("leased by %s until %s", row.LeaseOwner, row.LeaseExpiresAt.Format(time.RFC3339))
	case !stripeTakes:
		return Parked, "unknown outcome and the timestamp is past Stripe's 35 days: Stripe would refuse it; not re-sent"
	case row.Attempts > 0 && now.Sub(row.FirstSentAt) >= safe: // 0 attempts: never sent, its window starts at the next
		return Parked, fmt.Sprintf("unknown outcome older than Stripe's identifier window: not re-sent (first attempt %s, %s ago)",
			row.FirstSentAt.Format(time.RFC3339), now.Sub(row.FirstSentAt).Round(time.Minute))
	}
	return TakenOver, ""
}

// op is the write Reserve makes for one request.
type op int

const (
	opNone     op = iota
	opInsert      // a new row, with the slot
	opTakeOver    // the row's next epoch, with the slot
	opPark        // the row parked; its stale slot freed
	opFree        // only the event's stale slot freed
	opReopen      // a failed or parked row sending again (a replay), with the slot
	opDequeue     // a queued row sending (its use was counted at ingest), with the slot
)

// item is one request on its way through Reserve.
type item struct {
	i       int
	req     Request
	key     Key
	row     *Record
	slot    slot
	claim   Claim
	op      op
	newTok  int64 // the slot grant this send makes
	freeTok int64 // the stale grant this call frees (0: none)
	// use is the customer's use of the meter in the event's month as read,
	// with the cap that applies when capped.
	use     CapState
	capped  bool
	counted bool // the write statement added the event to use
}

// counts reports whether the send adds the event to its customer's use of
// the meter: a new row, or a replay of one Stripe refused (failed rows do
// not count; parked ones still do, as Stripe may have them).
func (it *item) counts() bool {
	d := it.claim.Decision
	if it.row != nil && it.row.Status == StatusQueued {
		return false // counted at ingest
	}
	return d == Acquired || d == Reopened && it.row != nil && it.row.Status == StatusFailed
}

type slotKey struct{ customer, meter string }

// plan gives each sending decision the customer's meter slot, or turns it
// into SlotBusy: one event per (customer, meter) per batch, and only where
// the slot is free, expired, or a stale grant of the same event being taken
// over. Takeovers go first (their window runs), then the oldest events.
// Copies of one event: the first decides, the rest follow it (Busy if it
// sends). Decisions that end an event free its stale slot. token makes new
// grants.
func plan(now time.Time, items []*item, token func() int64) {
	order := slices.Clone(items)
	slices.SortStableFunc(order, func(a, b *item) int {
		return cmp.Or(cmp.Compare(rank(a.claim.Decision), rank(b.claim.Decision)),
			a.key.EventTS.Compare(b.key.EventTS), cmp.Compare(a.key.Identifier, b.key.Identifier), cmp.Compare(a.i, b.i))
	})
	first := map[Key]*item{}
	taken := map[slotKey]bool{}
	for _, it := range order {
		if f, dup := first[it.key]; dup {
			it.claim = f.claim
			if f.claim.Decision.MaySend() || f.op == opPark {
				it.claim = Claim{Decision: Busy, Record: f.claim.Record, Reason: "another copy of the event in this batch is being handled"}
			}
			continue
		}
		first[it.key] = it
		sk := slotKey{it.req.Event.StripeCustomerID, it.req.Event.EventName}
		switch d := it.claim.Decision; {
		case d.MaySend():
			s := it.slot
			free := s.Token == 0 || !s.ExpiresAt.After(now) || (d != Acquired && s.Identifier == it.key.Identifier)
			if taken[sk] || !free {
				holder := s.Identifier
				if taken[sk] {
					holder = "another event of this batch"
				}
				it.claim = Claim{Decision: SlotBusy, Record: it.claim.Record,
					Reason: fmt.Sprintf("%s/%s is in flight with %s", sk.customer, sk.meter, holder)}
				continue
			}
			taken[sk] = true
			it.op, it.newTok = opInsert, token()
			if it.row != nil && it.row.Status == StatusQueued {
				it.op = opDequeue
			}
			switch d {
			case TakenOver:
				it.op = opTakeOver
			case Reopened:
				it.op = opReopen
			}
		case d == Parked:
			it.op = opPark
		}
	}
	// Stale slots of ended events, unless a send of this batch takes them.
	for _, it := range items {
		sk := slotKey{it.req.Event.StripeCustomerID, it.req.Event.EventName}
		ended := it.op == opPark || it.claim.Decision == AlreadyDelivered || it.claim.Decision == AlreadyTerminal
		if ended && it.slot.Token != 0 && it.slot.Identifier == it.key.Identifier && !taken[sk] && first[it.key] == it {
			taken[sk] = true
			it.freeTok = it.slot.Token
			if it.op == opNone {
				it.op = opFree
			}
		}
	}
}

func rank(d Decision) int {
	switch d {
	case TakenOver, Reopened:
		return 0
	case Acquired:
		return 1
	}
	return 2
}
