package startstop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestContract(t *testing.T) {
	t.Parallel()
	var s Service
	if err := s.Stop(context.Background()); err != nil { // before Start
		t.Fatal(err)
	}
	if err := s.Start(context.Background(), func(l, w context.Context) error { return nil }); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: %v", err)
	}

	var s2 Service
	workSawCancel := make(chan bool, 1)
	started := make(chan struct{})
	run := func(loopCtx, workCtx context.Context) error {
		close(started)
		<-loopCtx.Done() // stop taking work
		// In-flight work goes on until it is done: workCtx is still live.
		workSawCancel <- workCtx.Err() != nil
		return errors.New("run result")
	}
	if err := s2.Start(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background(), run); !errors.Is(err, ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	<-started
	if err := s2.Stop(context.Background()); err == nil || err.Error() != "run result" {
		t.Fatalf("Stop returns run's error, got %v", err)
	}
	if <-workSawCancel {
		t.Fatal("workCtx must outlive loopCtx until Stop's deadline")
	}
	if err := s2.Stop(context.Background()); err == nil { // idempotent, same answer
		t.Fatal("second Stop lost run's error")
	}
	select {
	case <-s2.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}

// Stop's deadline cancels work in progress, waits for it, and reports it.
func TestStopDeadlineCancelsWork(t *testing.T) {
	t.Parallel()
	var s Service
	started := make(chan struct{})
	if err := s.Start(context.Background(), func(loopCtx, workCtx context.Context) error {
		close(started)
		<-workCtx.Done() // a long Stripe call that only a hard stop ends
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past its deadline: %v", err)
	}
}

// Start and Stop from many goroutines at once: run starts at most once.
func TestStress(t *testing.T) {
	t.Parallel()
	for range 50 {
		var s Service
		var runs sync.WaitGroup
		count := 0
		var mu sync.Mutex
		for range 8 {
			runs.Add(2)
			go func() {
				defer runs.Done()
				_ = s.Start(context.Background(), func(l, w context.Context) error {
					mu.Lock()
					count++
					mu.Unlock()
					<-l.Done()
					return nil
				})
			}()
			go func() { defer runs.Done(); _ = s.Stop(context.Background()) }()
		}
		runs.Wait()
		_ = s.Stop(context.Background())
		mu.Lock()
		if count > 1 {
			t.Fatalf("run started %d times", count)
		}
		mu.Unlock()
	}
}
