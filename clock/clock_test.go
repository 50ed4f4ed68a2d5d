package clock_test

import (
	"testing"
	"time"

	"github.com/pelguard/pelguard/clock"
)

func TestSimAfterFiresOnAdvance(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := clock.NewSim(start)
	ch := clock.After(c, time.Minute)
	if c.Waiters() != 1 {
		t.Fatalf("%d waiters, want 1", c.Waiters())
	}
	c.Advance(59 * time.Second)
	select {
	case <-ch:
		t.Fatal("fired before its time")
	default:
	}
	c.Advance(time.Second)
	select {
	case got := <-ch:
		if !got.Equal(start.Add(time.Minute)) {
			t.Fatalf("fired at %s", got)
		}
	default:
		t.Fatal("did not fire when the clock reached its time")
	}
	if c.Waiters() != 0 {
		t.Fatalf("%d waiters left", c.Waiters())
	}
	c.Set(start) // backwards: nothing to fire, no panic
	if !c.Now().Equal(start) {
		t.Fatalf("Set: %s", c.Now())
	}
}

func TestFollowingSimAdvanceAndOr(t *testing.T) {
	t.Parallel()
	c := clock.NewSimFollowing()
	c.Advance(25 * time.Hour)
	if d := time.Until(c.Now()); d < 24*time.Hour || d > 26*time.Hour {
		t.Fatalf("following clock is %s ahead, want about 25h", d)
	}
	select {
	case <-clock.After(c, time.Hour): // the jump is past nothing yet: an hour from the new now
		t.Fatal("fired at once")
	case <-clock.After(c, 0):
	}
	if _, ok := clock.Or(nil).(clock.Real); !ok {
		t.Fatal("Or(nil) is not the wall clock")
	}
}
