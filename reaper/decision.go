package reaper

import (
	"time"

	"github.com/pelguard/pelguard/consumer"
)

// Kind is what the reaper decided for one pending entry (or one consumer).
// Kinds are stable: dashboards and the dry-run comparison key on them.
type Kind string

// Decisions, in the order DESIGN.md "Reaper, per pass" checks them.
const (
	// KindGone: the entry's body was trimmed or deleted; it is acked, since
	// nothing can ever process it, and counted so an operator sees trimming
	// outrun the consumers.
	KindGone Kind = "gone"
	// KindInvalid: the body fails validation; dead letter + ack.
	KindInvalid Kind = "invalid"
	// KindAlreadyBilled: the ledger row is terminal; acked without
	// redelivery (invariant 5). Partial batch, killed before XACK and AOF
	// rollback all end here.
	KindAlreadyBilled Kind = "already_billed"
	// KindConflict: the ledger row is terminal but records different
	// business fields than this event: dead letter + ack, never a silent ack.
	KindConflict Kind = "conflict"
	// KindLeaseLive: someone holds a live ledger lease: slow, not dead. Skipped
	// (invariant 5: never claim it).
	KindLeaseLive Kind = "lease_live"
	// KindMaxDeliveries: delivered too often; dead letter + ack + alert.
	KindMaxDeliveries Kind = "max_deliveries"
	// KindClaim: claimed with the min-idle fence and handed to the consumer's
	// own processing code. A KindRedriven decision follows with the outcome.
	KindClaim Kind = "claim"
	// KindRedriven: a claimed entry's re-drive ended; Outcome says how.
	KindRedriven Kind = "redriven"
	// KindClaimLost: the min-idle fence refused: a heartbeat reset the
	// entry's idle time or another reaper claimed it first. Skipped.
	KindClaimLost Kind = "claim_lost"
	// KindInFlight: this reaper is already re-driving the entry.
	KindInFlight Kind = "in_flight"
	// KindError: a Redis or ledger call for the entry failed; it stays
	// pending and the next pass tries again.
	KindError Kind = "error"
	// KindUnregistered: the entry's owner never registered as a pelguard
	// consumer (a team's consumer, which has no heartbeat: dead and slow
	// look the same) and nobody said it is stopped (--stopped-consumers, or
	// `consumer import` for the entry's period). Left alone, counted,
	// warned about every pass and alerted once.
	KindUnregistered Kind = "unregistered_consumer"
	// KindRemoveConsumer: an idle consumer with nothing pending was removed
	// from the group (hygiene). ID is empty; Consumer names it.
	KindRemoveConsumer Kind = "remove_consumer"
)

// Kinds returns every Kind, in the order above: for dashboards and
// documentation, and for the test that holds the decision table to a row per
// kind. Each call returns a new slice.
func Kinds() []Kind {
	return []Kind{KindGone, KindInvalid, KindAlreadyBilled, KindConflict, KindLeaseLive, KindMaxDeliveries,
		KindClaim, KindRedriven, KindClaimLost, KindInFlight, KindUnregistered, KindError, KindRemoveConsumer}
}

// Decision is one line of the reaper's account: what it saw and what it did
// (or, with DryRun, would have done).
type Decision struct {
	Time       time.Time        `json:"time"`
	Stream     string           `json:"stream"`
	Group      string           `json:"group"`
	ID         string           `json:"id,omitempty"`
	Consumer   string           `json:"consumer"` // the entry's owner when seen
	Idle       time.Duration    `json:"idle_ns"`
	Deliveries int64            `json:"deliveries,omitempty"`
	Kind       Kind             `json:"kind"`
	Key        string           `json:"key,omitempty"`    // customer_id/billing_period when the body parsed
	Reason     string           `json:"reason,omitempty"` // dead-letter reason, ledger status, or why
	Outcome    consumer.Outcome `json:"outcome,omitempty"`
	Error      string           `json:"error,omitempty"`
	DryRun     bool             `json:"dry_run,omitempty"`
}

// PassSummary counts one pass. RunOnce also waits for the pass's re-drives
// and counts their outcomes.
type PassSummary struct {
	Started   time.Time
	Duration  time.Duration
	Scanned   int // pending entries seen idle at least MinIdle
	Decisions map[Kind]int
	Outcomes  map[consumer.Outcome]int
}
