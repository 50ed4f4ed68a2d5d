package alerts

import (
	"context"
	"fmt"
	"github.com/pelguard/pelguard/clock"
	"sync"
	"time"
)

// maxDeadLetterExamples bounds the examples kept per stream and interval, so
// that Add stays cheap and memory flat during a flood of bad events.
const maxDeadLetterExamples = 10

// DeadLetterAggregator turns dead letters into one DeadLetters alert per
// stream per interval: a bad deploy that rejects 10,000 events is one
// message, not 10,000.
type DeadLetterAggregator struct {
	n        Notifier
	interval time.Duration
	clk      clock.Clock

	mu      sync.Mutex
	pending map[string]*DeadLetterInput // by stream

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// NewDeadLetterAggregator starts an aggregator that flushes into n every
// interval (a minute if interval ≤ 0). A nil clock is the wall clock. Stop it
// with Stop, which flushes what is left.
func NewDeadLetterAggregator(n Notifier, interval time.Duration, clk clock.Clock) *DeadLetterAggregator {
	if interval <= 0 {
		interval = time.Minute
	}
	if clk == nil {
		clk = clock.Real{}
	}
	a := &DeadLetterAggregator{
		n: n, interval: interval, clk: clk,
		pending: map[string]*DeadLetterInput{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go a.run()
	return a
}

// Add records one dead letter. It takes a mutex and never blocks on I/O.
func (a *DeadLetterAggregator) Add(stream, reason, sourceID, customerID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.pending[stream]
	if !ok {
		d = &DeadLetterInput{Stream: stream, CountsByReason: map[string]int{}}
		a.pending[stream] = d
	}
	d.CountsByReason[reason]++
	if len(d.Examples) < maxDeadLetterExamples {
		d.Examples = append(d.Examples, DeadLetterExample{SourceID: sourceID, Reason: reason, CustomerID: customerID})
	}
}

// Flush sends what has been added since the last flush, one alert per
// stream, and reports how many alerts it sent. The loop calls it every
// interval; tests call it directly.
func (a *DeadLetterAggregator) Flush() int {
	a.mu.Lock()
	pending := a.pending
	a.pending = map[string]*DeadLetterInput{}
	a.mu.Unlock()
	for _, stream := range sortedKeys(pending) {
		a.n.Notify(DeadLetters(*pending[stream]))
	}
	return len(pending)
}

func (a *DeadLetterAggregator) run() {
	defer close(a.done)
	for {
		select {
		case <-clock.After(a.clk, a.interval):
			a.Flush()
		case <-a.stop:
			return
		}
	}
}

// Stop ends the loop and flushes what is left into the notifier. It is safe
// to call more than once; it returns ctx's error if the loop does not end
// in time.
func (a *DeadLetterAggregator) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() { close(a.stop) })
	select {
	case <-a.done:
	case <-ctx.Done():
		return fmt.Errorf("alerts: stopping the dead-letter aggregator: %w", ctx.Err())
	}
	a.Flush()
	return nil
}
