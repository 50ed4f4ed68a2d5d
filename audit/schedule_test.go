package audit

import (
	"context"
	"testing"
	"time"
)

// SIGTERM semantics: Stop waits for the run in progress, then returns; the
// run completes and records its checkpoint.
func TestSchedulerStopWaitsForTheRunInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.world(t)
	a := b.auditor(t, nil)
	started, release := make(chan struct{}), make(chan struct{})
	a.afterLock = func() {
		select {
		case <-started:
		default:
			close(started)
		}
		<-release
	}
	reports := make(chan error, 10)
	s, err := a.NewScheduler("@every 1s", func(_ Report, err error) { reports <- err })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a run was in progress", err)
	case <-time.After(200 * time.Millisecond): // a negative check: nothing to wait for
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-reports; err != nil {
		t.Fatalf("scheduled run: %v", err)
	}
	var ok int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_runs WHERE status = 'ok' AND NOT manual`).Scan(&ok); err != nil || ok != 1 {
		t.Fatalf("%d ok scheduled runs (%v)", ok, err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := s.Start(context.Background()); err != ErrStopped {
		t.Fatalf("Start after Stop: %v", err)
	}
	if _, err := a.NewScheduler("not a cron", nil); err == nil {
		t.Fatal("bad schedule accepted")
	}
}
