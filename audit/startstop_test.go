package audit

import (
	"testing"

	"github.com/pelguard/pelguard/internal/startstop/startstoptest"
)

// The audit scheduler keeps the shared start/stop contract under concurrent
// Start/Stop (run under -race by make test).
func TestSchedulerStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.auditor(t, nil)
	startstoptest.Stress(t, func() startstoptest.Service {
		s, err := a.NewScheduler("@every 1h", nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
