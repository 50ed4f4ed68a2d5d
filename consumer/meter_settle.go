package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/pelguard/pelguard/internal/meterledger"
)

const (
	// settleSweepEvery is how often a sender settles the members that a
	// stopped sender left sending under delivered aggregates; settleAge is
	// how long ago such an aggregate was delivered (a live sender settles
	// its own within a statement).
	settleSweepEvery = 5 * time.Second
	settleAge        = 10 * time.Second
	// settleDrain bounds the last settle when the sender stops.
	settleDrain = 30 * time.Second
)

// memberSettler moves, off the sender's path, the members of the aggregates the
// sender recorded delivered (meterledger.RecordAggregates) to delivered
// (meterledger.SettleMembers). A busy customer's next second is formed
// once its aggregate's own row says delivered, not after its thousands of
// member rows are written; until settled, those members read as of unknown
// outcome, never as unsent.
type memberSettler struct {
	mu    sync.Mutex
	queue []meterledger.Aggregate
	wake  chan struct{}
}

func newMemberSettler() *memberSettler { return &memberSettler{wake: make(chan struct{}, 1)} }

// add queues aggs' members to be settled.
func (s *memberSettler) add(aggs []meterledger.Aggregate) {
	if len(aggs) == 0 {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, aggs...)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *memberSettler) take() []meterledger.Aggregate {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

// settleLoop settles what the sender queues, in batches, and at start and
// every settleSweepEvery what a stopped sender left, until ctx ends; then, once
// sendersDone is closed (no round adds more), it settles what is left and
// returns. A batch that fails is left to the sweep.
func (c *MeterConsumer) settleLoop(ctx context.Context, s *memberSettler, sendersDone <-chan struct{}) {
	sweep := time.NewTicker(settleSweepEvery)
	defer sweep.Stop()
	settle := func(ctx context.Context) {
		if aggs := s.take(); len(aggs) > 0 {
			if _, err := c.ledger.SettleMembers(ctx, aggs); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("settling the members of delivered meter aggregates; settled later", "stream", c.cfg.Stream,
					"aggregates", len(aggs), "err", err)
			}
		}
	}
	leftovers := func() {
		if n, err := c.ledger.SettleLeftovers(ctx, c.cfg.Stream, settleAge); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("settling the members of delivered meter aggregates a stopped sender left", "stream", c.cfg.Stream, "err", err)
		} else if n > 0 {
			c.cfg.Logger.Info("settled the members of delivered meter aggregates a stopped sender left", "stream", c.cfg.Stream, "events", n)
		}
	}
	for leftovers(); ctx.Err() == nil; {
		select {
		case <-s.wake:
			settle(ctx)
		case <-sweep.C:
			leftovers()
		case <-ctx.Done():
		}
	}
	<-sendersDone
	c.settler.CompareAndSwap(s, nil)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleDrain)
	defer cancel()
	settle(dctx)
}
