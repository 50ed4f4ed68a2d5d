package reaper

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/ledger"
)

// Explanation is the reaper's verdict on one pending entry, computed as a
// pass computes it but without acting on it: what a pass would decide now,
// and why. The console's PEL page shows these ("is this stuck entry safe to
// leave?").
type Explanation struct {
	// Decision is what a pass would record: Kind, Key and Reason, with the
	// entry's owner, idle time and delivery count. DryRun is true.
	Decision Decision
	// Detail is the dead letter's detail, for the kinds that dead-letter.
	Detail string
	// Due: the entry is idle at least MinIdle, so the next pass looks at it.
	// When false the pass does not see it yet (XPENDING IDLE) and Decision
	// is what it would decide on today's ledger once it does.
	Due bool
	// Registered: the owner is a registered pelguard consumer (or the
	// reaper itself, or named in StoppedConsumers).
	Registered bool
	// Row is the ledger row the decision read; nil when there is none.
	Row *RowState
}

// RowState is the part of a ledger row a decision reads, for display.
type RowState struct {
	CustomerID, BillingPeriod string
	Status                    string
	ChargeID                  string
	AmountCents               int64
	Currency                  string
	// LeaseOwner and LeaseExpiresAt: the ledger lease (zero when none).
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// LeaseLive: the lease is held at the decision's clock.
	LeaseLive bool
	Attempts  int
	// Meter and Units: a meter event's row (a meter stream): the meter's
	// event name and the event's value; CustomerID is then the Stripe
	// customer and the charge fields are empty.
	Meter string
	Units int64
}

// Policy is the part of the Config a decision depends on, as this reaper
// applies it.
type Policy struct {
	MinIdle          time.Duration
	MaxDeliveries    int64
	StoppedConsumers []string
	ExternalLedger   string
}

// Policy reports the decision settings of r.
func (r *Reaper) Policy() Policy {
	return Policy{MinIdle: r.cfg.MinIdle, MaxDeliveries: r.cfg.MaxDeliveries,
		StoppedConsumers: append([]string(nil), r.cfg.StoppedConsumers...), ExternalLedger: r.cfg.ExternalLedger}
}

// Explain decides pending entries of one of r's streams exactly as a pass
// does — the same fetch (bodies, ledger rows), the same liveness registry
// and imported periods, the same pure decideEntry on r's clock — and acts
// on none of them: no ack, claim, dead letter, alert, metric or log line.
// pend is a page of XPENDING's extended form in any order, whatever the
// entries' idle times (Due says which a pass would consider). It is safe
// for concurrent use and beside passes: it keeps no state in r.
func (r *Reaper) Explain(ctx context.Context, stream string, pend []redis.XPendingExt) ([]Explanation, error) {
	for _, ms := range r.meters {
		if ms.Stream == stream {
			return r.explainMeter(ctx, ms, pend)
		}
	}
	var sg StreamGroup
	for _, st := range r.streams {
		if st.Stream == stream {
			sg = st.StreamGroup
		}
	}
	if sg.Stream == "" {
		return nil, fmt.Errorf("reaper: %q is not one of this reaper's streams", stream)
	}
	if len(pend) == 0 {
		return nil, nil
	}
	imported := map[string]bool{}
	if r.team == nil {
		var err error
		if imported, err = r.ledger.ImportedPeriods(ctx); err != nil {
			return nil, fmt.Errorf("reading the periods with imported history: %w", err)
		}
	}
	reg, err := consumer.Registered(ctx, r.cfg.Redis, sg.Stream, sg.Group)
	if err != nil {
		return nil, err
	}
	st := &streamState{StreamGroup: sg, registered: make(map[string]bool, len(reg))}
	for name := range reg {
		st.registered[name] = true
	}
	cfg := decideConfig{MaxDeliveries: r.cfg.MaxDeliveries, Rules: r.cfg.Rules, Imported: imported, External: r.team != nil}
	// XRANGE over the span needs the page in id order, as XPENDING returns it.
	items := make([]entry, len(pend))
	entries := make([]*entry, len(pend))
	for i, pe := range pend {
		items[i].pe = pe
		items[i].ownerUnknown = r.team == nil && r.ownerUnknown(st, pe.Consumer)
		entries[i] = &items[i]
	}
	sorted := append([]*entry(nil), entries...)
	slices.SortFunc(sorted, func(a, b *entry) int { return compareIDs(a.pe.ID, b.pe.ID) })
	rows, err := r.fetch(ctx, st, sorted)
	if err != nil {
		return nil, err
	}
	now := r.cfg.Clock.Now()
	var again []*entry
	for _, e := range entries {
		if e.v = decideEntry(cfg, e.input(rows, now)); e.v.NeedRow {
			again = append(again, e)
		}
	}
	if len(again) > 0 {
		if err := r.refetchRows(ctx, again, rows); err != nil {
			return nil, err
		}
		for _, e := range again {
			e.v = decideEntry(cfg, e.input(rows, now))
		}
	}
	out := make([]Explanation, len(entries))
	for i, e := range entries {
		d := r.decision(st, e.pe, e.v)
		d.Time, d.DryRun = now, true
		x := Explanation{Decision: d, Detail: e.v.Detail, Due: e.pe.Idle >= r.cfg.MinIdle,
			Registered: r.team == nil && !r.ownerUnknown(st, e.pe.Consumer)}
		if rec, ok := rows[e.rowKey]; ok && !e.gone {
			x.Row = rowState(rec, now)
		}
		out[i] = x
	}
	return out, nil
}

func rowState(rec ledger.Record, now time.Time) *RowState {
	return &RowState{CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, Status: string(rec.Status),
		ChargeID: rec.ChargeID, AmountCents: rec.AmountCents, Currency: rec.Currency,
		LeaseOwner: rec.LeaseOwner, LeaseExpiresAt: rec.LeaseExpiresAt, LeaseLive: rec.LeaseLive(now), Attempts: rec.Attempts}
}
