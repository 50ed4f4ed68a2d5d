package consumer_test

import (
	"time"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/stripesim"
)

func newSimClock(t time.Time) *clock.Sim { return clock.NewSim(t) }

func simLatency(d time.Duration) stripesim.Faults {
	return stripesim.Faults{Latency: stripesim.Latency{Fixed: d}}
}
