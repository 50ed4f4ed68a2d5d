package consumer

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/ledger"
)

//go:embed heartbeat.lua
var heartbeatLua string

var heartbeatScript = redis.NewScript(heartbeatLua)

// renew runs heartbeat.lua for ids and returns the set still owned.
func renew(ctx context.Context, rdb redis.Scripter, stream, group, name string, ids []string) (map[string]bool, error) {
	args := make([]any, 0, len(ids)+2)
	args = append(args, group, name)
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := heartbeatScript.Run(ctx, rdb, []string{stream}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("renewing %d entries on %s: %w", len(ids), stream, err)
	}
	owned := make(map[string]bool, len(res))
	for _, id := range res {
		owned[id] = true
	}
	return owned, nil
}

// hold is one stream entry this process is responsible for, from the moment
// XREADGROUP (or the reaper's XCLAIM) returned it until it is acked or left.
type hold struct {
	stream, id string
	ctx        context.Context
	cancel     context.CancelCauseFunc

	acking atomic.Bool // the entry is being acked (see heartbeat.acking)
	// settled, when set, lets apply hand a charge to the consumer's
	// settler, which ends the event with it (processPrepared).
	settled func(Outcome, error)

	mu    sync.Mutex
	lease *ledger.Record // set once Reserve gave us the ledger lease
	until time.Time      // our lease is valid at least until then (ledger clock)
	// proven is when the entry was last shown to be ours in Redis: the
	// moment the XREADGROUP (">") or renewal that showed it was sent, so
	// its idle time in the PEL is at most time.Since(proven).
	proven time.Time
}

func (h *hold) setProven(t time.Time) {
	h.mu.Lock()
	if t.After(h.proven) {
		h.proven = t
	}
	h.mu.Unlock()
}

func (h *hold) provenAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.proven
}

func (h *hold) setLease(r *ledger.Record) {
	h.mu.Lock()
	h.lease = r
	h.until = r.LeaseExpiresAt
	h.mu.Unlock()
}

func (h *hold) extendTo(t time.Time) {
	h.mu.Lock()
	if t.After(h.until) {
		h.until = t
	}
	h.mu.Unlock()
}

func (h *hold) leaseUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until
}

func (h *hold) getLease() *ledger.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// errLeaseLost is the cause an event's context is cancelled with when the
// heartbeat finds the PEL entry or the ledger lease gone.
var errLeaseLost = fmt.Errorf("lease lost: %w", ledger.ErrLeaseLost)

// heartbeat renews every hold every interval: the PEL entry's idle time
// (heartbeat.lua) and the ledger lease (one fenced UPDATE for all). A hold
// whose entry or lease is gone has its context cancelled.
type heartbeat struct {
	rdb      redis.UniversalClient
	ledger   *ledger.Ledger
	stream   string // where the consumer registers its liveness
	group    string
	name     string
	lease    time.Duration
	interval time.Duration
	logger   *slog.Logger
	metrics  *Metrics
	disabled bool // tests: prove the other defences hold without it

	// checker, when the consumer runs one, coalesces stillOwned's
	// re-checks (owned.go); nil: one script per check.
	checker *ownedChecker

	mu    sync.Mutex
	holds map[string]*hold // stream + "\x00" + id

	// statCounter counts the stream entries this processor handled (any
	// outcome); register publishes it with the rate since its last beat
	// (liveness.go, Stats).
	statCounter
}

func newHeartbeat(rdb redis.UniversalClient, l *ledger.Ledger, stream, group, name string, lease time.Duration, logger *slog.Logger, m *Metrics, disabled bool) *heartbeat {
	return &heartbeat{rdb: rdb, ledger: l, stream: stream, group: group, name: name, lease: lease,
		interval: lease / 3, logger: logger, metrics: m, disabled: disabled, holds: map[string]*hold{}}
}

// add starts holding an entry. The returned hold's context is a child of
// parent, cancelled with errLeaseLost when the hold is lost.
func (hb *heartbeat) add(parent context.Context, stream, id string) *hold {
	ctx, cancel := context.WithCancelCause(parent)
	h := &hold{stream: stream, id: id, ctx: ctx, cancel: cancel}
	hb.mu.Lock()
	if old, ok := hb.holds[stream+"\x00"+id]; ok {
		old.cancel(errLeaseLost)
	}
	hb.holds[stream+"\x00"+id] = h
	hb.mu.Unlock()
	return h
}

// addLedger holds a row a ledger-driven retry charges: no stream entry,
// only the ledger lease, which the heartbeat renews like any other.
func (hb *heartbeat) addLedger(parent context.Context, k ledger.Key) *hold {
	return hb.add(parent, "", "ledger:"+k.String())
}

// ledgerOnly reports a hold without a stream entry (addLedger).
func (h *hold) ledgerOnly() bool { return h.stream == "" }

// remove stops holding an entry.
func (hb *heartbeat) remove(h *hold) {
	hb.mu.Lock()
	if hb.holds[h.stream+"\x00"+h.id] == h {
		delete(hb.holds, h.stream+"\x00"+h.id)
	}
	hb.mu.Unlock()
	h.cancel(nil)
}

// held reports whether h is still registered and not being acked.
func (hb *heartbeat) held(h *hold) bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.holds[h.stream+"\x00"+h.id] == h && !h.acking.Load()
}

// acking marks the hold of an entry about to be acked: from now on its
// absence from the PEL is the ack, not a loss.
func (hb *heartbeat) acking(stream, id string) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if h := hb.holds[stream+"\x00"+id]; h != nil {
		h.acking.Store(true)
	}
}

// run ticks until ctx is done: it registers the consumer's liveness on
// its stream and, unless disabled, renews every hold.
func (hb *heartbeat) run(ctx context.Context) {
	hb.register(ctx)
	t := time.NewTicker(hb.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			hb.register(ctx)
			if !hb.disabled {
				hb.beat(ctx)
			}
		}
	}
}

// register refreshes the liveness entry (see liveness.go). A failure is
// logged: the worst it causes is a reaper that leaves this consumer's
// entries alone a little longer.
func (hb *heartbeat) register(ctx context.Context) {
	if hb.stream == "" {
		return
	}
	now := hb.ledger.Now()
	if err := registerWithStats(ctx, hb.rdb, hb.stream, hb.group, hb.name, now, hb.stats(now)); err != nil && ctx.Err() == nil {
		hb.logger.WarnContext(ctx, "heartbeat: registering liveness failed", slog.Any("error", err))
	}
}

// beat renews every hold once, within one interval: a hung Redis or a
// blocked ledger update must not stall renewals silently (a timed-out ledger
// extension cancels the work it covers, like any failed one).
func (hb *heartbeat) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, hb.interval)
	defer cancel()
	beatStart := hb.ledger.Now() // the renewed leases run from no earlier than this
	hb.mu.Lock()
	byStream := map[string][]*hold{}
	for _, h := range hb.holds {
		byStream[h.stream] = append(byStream[h.stream], h)
	}
	hb.mu.Unlock()
	if len(byStream) == 0 {
		return
	}
	var leased []ledger.Record
	leaseHolds := map[ledger.Key]*hold{}
	for stream, hs := range byStream {
		if stream != "" { // a ledger-only hold has no PEL entry: its ledger lease is all
			hb.renewEntries(ctx, stream, hs)
		}
		for _, h := range hs {
			if r := h.getLease(); r != nil && h.ctx.Err() == nil {
				leased = append(leased, *r)
				leaseHolds[r.Key] = h
			}
		}
	}
	if len(leased) == 0 {
		return
	}
	lost, err := hb.ledger.ExtendMany(ctx, leased, hb.lease)
	if err != nil {
		// We could not renew. A lease that is still valid until after the
		// next beat cannot have been taken over, so its work goes on; one
		// that may expire before then is treated as lost: its work stops,
		// the row stays pending and a later delivery retries with the same
		// key. Cheaper than racing a takeover.
		hb.logger.WarnContext(ctx, "heartbeat: extending ledger leases failed", slog.Any("error", err))
		deadline := hb.ledger.Now().Add(hb.interval)
		for _, h := range leaseHolds {
			if h.leaseUntil().Before(deadline) {
				hb.metrics.heartbeat(h.stream, "lost", 1)
				h.cancel(errLeaseLost)
			}
		}
		return
	}
	renewedUntil := beatStart.Add(hb.lease)
	for k, h := range leaseHolds {
		if !slices.Contains(lost, k) {
			h.extendTo(renewedUntil)
		}
	}
	for _, k := range lost {
		hb.logger.WarnContext(ctx, "heartbeat: ledger lease lost; cancelling its work", slog.String("key", k.String()))
		hb.metrics.heartbeat(leaseHolds[k].stream, "lost", 1)
		leaseHolds[k].cancel(errLeaseLost)
	}
}

// renewEntries resets the idle time of one stream's held entries and
// cancels the work of those no longer ours.
func (hb *heartbeat) renewEntries(ctx context.Context, stream string, hs []*hold) {
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	sent := time.Now()
	owned, err := renew(ctx, hb.rdb, stream, hb.group, hb.name, ids)
	if err != nil {
		// Redis unreachable: we cannot tell; the ledger lease still
		// protects the Stripe call, and the next beat tries again.
		hb.logger.WarnContext(ctx, "heartbeat: renewing PEL entries failed", slog.String("stream", stream), slog.Any("error", err))
		hb.metrics.heartbeat(stream, "error", len(ids))
		return
	}
	for _, h := range hs {
		if owned[h.id] {
			h.setProven(sent)
		}
		if !owned[h.id] && hb.held(h) { // an entry acked meanwhile is done, not lost
			hb.logger.WarnContext(ctx, "heartbeat: entry no longer ours; cancelling its work",
				slog.String("stream", stream), slog.String("id", h.id))
			hb.metrics.heartbeat(stream, "lost", 1)
			h.cancel(errLeaseLost)
		}
	}
	hb.metrics.heartbeat(stream, "renewed", len(owned))
}

// stillOwned re-checks one entry just before a Stripe call. A ledger-only
// hold has no entry: its lease is fenced by the ledger alone.
//
// An entry shown to be ours less than half a heartbeat interval ago (read
// as new, or renewed) is taken as ours without another round trip: its
// idle time is below lease/6, and a reaper claims only entries idle longer
// than its --min-idle, which must exceed lease/3 (it warns at start when
// it does not). A claim below that fence (a manual XCLAIM … 0, a reaper
// misconfigured) takes an entry whose ledger lease is ours and live: its
// Reserve answers Busy and it leaves the row alone, and our charge is
// recorded under our epoch as usual.
func (hb *heartbeat) stillOwned(ctx context.Context, h *hold) (bool, error) {
	if h.ledgerOnly() {
		return true, nil
	}
	if time.Since(h.provenAt()) < hb.interval/2 {
		return true, nil
	}
	if hb.checker != nil {
		return hb.checker.check(ctx, h)
	}
	sent := time.Now()
	owned, err := renew(ctx, hb.rdb, h.stream, hb.group, hb.name, []string{h.id})
	if err != nil {
		return false, err
	}
	if owned[h.id] {
		h.setProven(sent)
	}
	return owned[h.id], nil
}
