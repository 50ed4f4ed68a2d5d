package console

import (
	"slices"
	"time"

	"github.com/pelguard/pelguard/consumer"
)

// A consumer's state is decided here, once, from the liveness registry
// (consumer.Registered), the reaper's --stopped-consumers and the group
// (XINFO CONSUMERS), and said in the same words on every page that names
// a consumer (the overview's consumers panel, the PEL page).

// consumerState is what a consumer is now, in words.
type consumerState struct {
	// Key is one of live, silent, unregistered, stopped (CSS and tests).
	Key string
	// Word is the state as the pages show it; Why says what it means for
	// the consumer's pending entries.
	Word, Why string
}

// The states. A registered consumer beats every lease/3: silent past the
// default lease means stopped, crashed or hung.
const (
	stateLive         = "live"
	stateSilent       = "silent"
	stateUnregistered = "unregistered"
	stateStopped      = "stopped"
)

// stateOf decides name's state on st: beat is its last heartbeat (ok:
// registered), beatAge its age at the console's clock.
func (s *Server) stateOf(st Stream, name string, ok bool, beatAge time.Duration) consumerState {
	switch {
	case ok && beatAge <= consumer.DefaultLease:
		return consumerState{stateLive, "live, heartbeat " + ago(beatAge) + " ago", "a running pelguard consumer"}
	case ok:
		return consumerState{stateSilent, "silent " + ago(beatAge), "no heartbeat for longer than a lease: stopped, crashed or hung; the reaper re-drives what it holds"}
	case slices.Contains(s.cfg.Reaper.StoppedConsumers, name):
		return consumerState{stateStopped, "stopped (--stopped-consumers)", "never registered, named stopped: the reaper re-drives what it holds after the ledger check"}
	case st.Meter:
		return consumerState{stateUnregistered, "never registered", "not a running pelguard meter consumer (they register): the reaper judges its entries by the meter ledger's leases"}
	}
	return consumerState{stateUnregistered, "never registered", "not a pelguard consumer (a team's own?): the reaper leaves its entries alone until it is named in --stopped-consumers"}
}

// gone reports a consumer that left: it holds nothing, and neither a
// heartbeat nor a read (XINFO's idle) is more recent than --consumer-idle.
// The reaper's hygiene removes such consumers from the group and forgets
// them; the panel leaves them out at once.
func (s *Server) gone(r *consumerRow) bool {
	if s.cfg.ConsumerIdle <= 0 || r.Held > 0 {
		return false
	}
	last := r.beatAge
	if r.Member {
		last = min(last, r.memberIdle)
	}
	return last > s.cfg.ConsumerIdle
}
