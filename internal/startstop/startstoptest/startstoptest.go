// Package startstoptest checks that a service keeps pelguard's start/stop
// contract (internal/startstop) under concurrent use, as River's
// startstoptest does: the consumer, the reaper and the audit scheduler each
// run it in their own tests, under -race.
package startstoptest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/startstop"
)

// Service is what the contract covers.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Rounds is how many fresh services Stress hammers.
const Rounds = 10

// Stress builds Rounds services with newService and starts and stops each
// from several goroutines at once: at most one Start succeeds, every other
// Start answers ErrAlreadyStarted or ErrStopped, every Stop returns nil (the
// service stops cleanly), and a Start after Stop is refused with ErrStopped.
func Stress(t testing.TB, newService func() Service) {
	t.Helper()
	for range Rounds {
		stressOne(t, newService())
	}
}

func stressOne(t testing.TB, svc Service) {
	t.Helper()
	ctx := context.Background()
	const n = 8
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		started  int
		startErr []error
		stopErr  []error
	)
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if i%2 == 0 {
				err := svc.Start(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					started++
				} else if !errors.Is(err, startstop.ErrAlreadyStarted) && !errors.Is(err, startstop.ErrStopped) {
					startErr = append(startErr, err)
				}
				return
			}
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := svc.Stop(sctx); err != nil {
				mu.Lock()
				stopErr = append(stopErr, err)
				mu.Unlock()
			}
		}()
	}
	close(gate)
	wg.Wait()
	if started > 1 {
		t.Errorf("Start succeeded %d times under concurrent use; want at most once", started)
	}
	for _, err := range startErr {
		t.Errorf("Start: unexpected error %v (want nil, ErrAlreadyStarted or ErrStopped)", err)
	}
	for _, err := range stopErr {
		t.Errorf("Stop: %v", err)
	}
	// Whatever the interleaving, the service is now stopped for good.
	if err := svc.Stop(ctx); err != nil {
		t.Errorf("Stop after the storm: %v", err)
	}
	if err := svc.Start(ctx); !errors.Is(err, startstop.ErrStopped) {
		t.Errorf("Start after Stop: %v, want ErrStopped", err)
	}
}
