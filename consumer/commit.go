package consumer

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/internal/ledger"
)

// settler records the consumer's charged outcomes in groups and acks them:
// whatever the workers handed over while the previous group was being
// settled goes into the next one. Per group, in invariant 3's order: one
// transaction records every charge (ledger.FinishCharged: each row fenced
// by its own epoch, the ledger witness bumped in the same transaction), one
// Mirror makes that commit witnessed outside Postgres, one XACK
// acknowledges the entries whose charge was recorded. An entry whose write
// was fenced out (its lease went to someone else) is not acked.
//
// A worker hands its charge over and takes its next event without waiting
// for the commit: the workers bound the Stripe calls in flight, the settler
// the ledger's round trips and WAL flushes. The hold of a handed-over entry
// stays with the heartbeat until its group is settled.
type settler struct {
	p    *Processor
	reqs chan settleReq
	max  int
}

// settleReq is one charged outcome waiting for its group.
type settleReq struct {
	ctx      context.Context // the event's (its span is the parent of redis.xack)
	h        *hold
	rec      ledger.Record // as held: its epoch fences the write
	chargeID string
	// done ends the event (span, metrics, log, hold) with its outcome.
	done func(Outcome, error)
}

func newSettler(p *Processor, max int) *settler {
	return &settler{p: p, reqs: make(chan settleReq, max), max: max}
}

// submit queues one charged outcome; it blocks only while a full group
// waits (back-pressure on the workers).
func (s *settler) submit(r settleReq) { s.reqs <- r }

// run settles groups until stop is closed, then settles whatever is still
// queued. The caller closes stop only after every worker that could submit
// has returned, so nothing handed over is left unsettled.
func (s *settler) run(stop <-chan struct{}) {
	batch := make([]settleReq, 0, s.max)
	for {
		select {
		case r := <-s.reqs:
			batch = append(batch[:0], r)
		case <-stop:
			for len(s.reqs) > 0 {
				s.settle(s.drain(batch[:0]))
			}
			return
		}
		s.settle(s.drain(batch))
	}
}

// drain adds whatever is queued, up to max.
func (s *settler) drain(batch []settleReq) []settleReq {
	for len(batch) < s.max {
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// settle records, mirrors and acks one group. Two entries of one key (a
// stale holder's and the new holder's) are never in one statement:
// FinishCharged answers per key, so the second goes into a group of its own.
func (s *settler) settle(batch []settleReq) {
	for len(batch) > 0 {
		seen := make(map[ledger.Key]bool, len(batch))
		var group, later []settleReq
		for _, r := range batch {
			if seen[r.rec.Key] {
				later = append(later, r)
				continue
			}
			seen[r.rec.Key] = true
			group = append(group, r)
		}
		s.settleGroup(group)
		batch = later
	}
}

func (s *settler) settleGroup(group []settleReq) {
	ctx, cancel := detach(context.Background()) // charges were made: not cancelled, but bounded
	defer cancel()
	recorded := s.record(ctx, group)
	var acks []settleReq
	for i, r := range group {
		switch err := recorded[i]; {
		case err == nil:
			acks = append(acks, r)
		case errors.Is(err, ledger.ErrLeaseLost):
			// Someone took over (our lease expired). Whatever they record
			// wins; with the same idempotency key they got the same charge.
			// Not recorded by us: no ack (invariant 3).
			r.done(OutcomeLeaseLost, nil)
		default:
			r.done(OutcomeRetryLater, fmt.Errorf("recording %s: %w", ledger.StatusCharged, err))
		}
	}
	if len(acks) == 0 {
		return
	}
	err := s.ack(ctx, acks)
	for _, r := range acks {
		r.done(OutcomeCharged, err)
	}
}

// record writes the group's charges in one transaction; the error at i is
// nil when group[i] was recorded. If the statement itself fails, one bad
// row must not hold the others hostage: they are recorded one by one.
func (s *settler) record(ctx context.Context, group []settleReq) []error {
	l := s.p.cfg.ledger
	errs := make([]error, len(group))
	cs := make([]ledger.Charged, len(group))
	for i, r := range group {
		cs[i] = ledger.Charged{Record: r.rec, ChargeID: r.chargeID}
	}
	done, err := l.FinishCharged(ctx, cs)
	if err != nil {
		for i, r := range group {
			_, errs[i] = l.Finish(ctx, r.rec, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: r.chargeID})
		}
		return errs
	}
	for i, r := range group {
		if !done[r.rec.Key] {
			errs[i] = fmt.Errorf("recording charge %s on %s (epoch %d): %w", r.chargeID, r.rec.Key, r.rec.Epoch, ledger.ErrLeaseLost)
		}
	}
	return errs
}

// ack mirrors the witness once, then acknowledges every entry of the group
// with one XACK per stream (a consumer reads one). Each entry gets a
// redis.xack span under its event's.
func (s *settler) ack(ctx context.Context, acks []settleReq) error {
	p := s.p
	byStream := map[string][]string{}
	spans := make([]trace.Span, len(acks))
	for i, r := range acks {
		p.hb.acking(r.h.stream, r.h.id)
		byStream[r.h.stream] = append(byStream[r.h.stream], r.h.id)
		_, spans[i] = p.tracer.Start(r.ctx, "redis.xack", trace.WithSpanKind(trace.SpanKindClient))
	}
	err := p.cfg.Witness.Mirror(ctx)
	if err != nil {
		// The commit these acks follow is not witnessed outside Postgres
		// yet: no ack; the redeliveries find the rows charged.
		err = fmt.Errorf("mirroring the ledger witness before XACK: %w", err)
	} else {
		for stream, ids := range byStream {
			if xerr := p.cfg.Redis.XAck(ctx, stream, p.cfg.Group, ids...).Err(); xerr != nil {
				// Harmless for money: the ledger is charged, so the
				// redeliveries (or the reaper) ack without a Stripe call.
				err = fmt.Errorf("XACK %d entries of %s: %w", len(ids), stream, xerr)
			}
		}
	}
	for _, sp := range spans {
		if err != nil {
			sp.SetStatus(codes.Error, "XACK failed")
		}
		sp.End()
	}
	return err
}
