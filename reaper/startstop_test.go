package reaper_test

import (
	"testing"

	"github.com/pelguard/pelguard/internal/startstop/startstoptest"
)

// The reaper keeps the shared start/stop contract under concurrent
// Start/Stop (run under -race by make test).
func TestReaperStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	startstoptest.Stress(t, func() startstoptest.Service {
		return b.newReaper(t, b.config(t, ""))
	})
}
