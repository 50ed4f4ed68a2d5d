package consumer

import (
	"context"

	"fmt"

	"github.com/pelguard/pelguard/internal/ledger"
)

// committer records charged outcomes in groups: whatever workers finished
// while the previous statement was being written goes into the next one
// (ledger.FinishCharged), so a busy consumer pays one round trip and one WAL
// flush for many charges instead of one each. Each worker still waits for
// the commit of its own outcome before it acks (invariant 3), and each row
// is still fenced by its own epoch.
type committer struct {
	ledger *ledger.Ledger
	reqs   chan commitReq
	max    int
}

type commitReq struct {
	c    ledger.Charged
	done chan error
}

func newCommitter(l *ledger.Ledger, max int) *committer {
	return &committer{ledger: l, reqs: make(chan commitReq), max: max}
}

// finish queues one charged outcome and waits for its commit. It returns
// nil once recorded, or an error wrapping ledger.ErrLeaseLost.
func (c *committer) finish(ctx context.Context, rec ledger.Record, chargeID string) error {
	done := make(chan error, 1)
	c.reqs <- commitReq{c: ledger.Charged{Record: rec, ChargeID: chargeID}, done: done}
	return <-done
}

// run serves finish until stop is closed; the caller closes it only after
// every worker that could call finish has returned.
func (c *committer) run(stop <-chan struct{}) {
	batch := make([]commitReq, 0, c.max)
	for {
		select {
		case <-stop:
			return
		case r := <-c.reqs:
			batch = append(batch[:0], r)
		}
	drain:
		for len(batch) < c.max {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		c.commit(batch)
	}
}

func (c *committer) commit(batch []commitReq) {
	ctx, cancel := detach(context.Background()) // a charge was made: not cancelled, but bounded
	defer cancel()
	cs := make([]ledger.Charged, len(batch))
	for i, r := range batch {
		cs[i] = r.c
	}
	done, err := c.ledger.FinishCharged(ctx, cs)
	if err != nil {
		// One bad row must not hold the others hostage: record one by one.
		for _, r := range batch {
			_, ferr := c.ledger.Finish(ctx, r.c.Record, ledger.Outcome{Status: ledger.StatusCharged, ChargeID: r.c.ChargeID})
			r.done <- ferr
		}
		return
	}
	for _, r := range batch {
		if done[r.c.Record.Key] {
			r.done <- nil
		} else {
			r.done <- fmt.Errorf("recording charge %s on %s (epoch %d): %w", r.c.ChargeID, r.c.Record.Key, r.c.Record.Epoch, ledger.ErrLeaseLost)
		}
	}
}
