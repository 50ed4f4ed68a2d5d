package consumer_test

import (
	"testing"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/startstop/startstoptest"
)

// The consumer keeps the shared start/stop contract under concurrent
// Start/Stop (run under -race by make test).
func TestConsumerStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{})
	startstoptest.Stress(t, func() startstoptest.Service {
		c, err := consumer.New(b.config(t, ""))
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}
