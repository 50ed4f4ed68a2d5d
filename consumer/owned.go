package consumer

import (
	"context"
	"time"
)

// ownedChecker coalesces the consumer's re-checks of ownership just before
// each Stripe call (heartbeat.stillOwned): every worker that asks while the
// previous script runs is answered by the next one, so a busy consumer
// pays one Redis round trip for many calls instead of one each. Each check
// still runs after its worker asked, so "just before the call" holds.
type ownedChecker struct {
	hb   *heartbeat
	reqs chan ownedReq
	max  int
}

type ownedReq struct {
	h     *hold
	reply chan ownedAnswer // buffered: the checker never waits for a worker
}

type ownedAnswer struct {
	owned bool
	err   error
}

func newOwnedChecker(hb *heartbeat, max int) *ownedChecker {
	return &ownedChecker{hb: hb, reqs: make(chan ownedReq), max: max}
}

// check asks whether h's entry is still this consumer's.
func (c *ownedChecker) check(ctx context.Context, h *hold) (bool, error) {
	r := ownedReq{h: h, reply: make(chan ownedAnswer, 1)}
	select {
	case c.reqs <- r:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case a := <-r.reply:
		return a.owned, a.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// run answers checks until stop is closed (after the workers returned).
func (c *ownedChecker) run(stop <-chan struct{}) {
	batch := make([]ownedReq, 0, c.max)
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
		c.answer(batch)
	}
}

// answer runs heartbeat.lua once per stream for the batch.
func (c *ownedChecker) answer(batch []ownedReq) {
	ctx, cancel := context.WithTimeout(context.Background(), max(c.hb.interval, time.Second))
	defer cancel()
	byStream := map[string][]ownedReq{}
	for _, r := range batch {
		byStream[r.h.stream] = append(byStream[r.h.stream], r)
	}
	for stream, rs := range byStream {
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.h.id
		}
		sent := time.Now()
		owned, err := renew(ctx, c.hb.rdb, stream, c.hb.group, c.hb.name, ids)
		for _, r := range rs {
			if owned[r.h.id] {
				r.h.setProven(sent)
			}
			r.reply <- ownedAnswer{owned: owned[r.h.id], err: err}
		}
	}
}
