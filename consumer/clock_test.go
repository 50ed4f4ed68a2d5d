package consumer_test

import (
	"time"

	"github.com/pelguard/pelguard/internal/clock"
)

func newSimClock(t time.Time) *clock.Sim { return clock.NewSim(t) }
