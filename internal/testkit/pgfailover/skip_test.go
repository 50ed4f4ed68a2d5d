package pgfailover_test

import (
	"testing"

	"github.com/pelguard/pelguard/internal/testkit/pgfailover"
)

// With PG_BINDIR pointing nowhere, Start skips (outside CI) instead of
// failing or falling back to another install: the subtest must end skipped.
// (Under CI=true it fails instead: TestUnavailableFailsUnderCIAndSaysHowToInstall.)
func TestStartSkipsWithoutServerBinaries(t *testing.T) {
	t.Setenv("PG_BINDIR", t.TempDir()+"/nowhere")
	t.Setenv("CI", "")
	started := false
	ran := t.Run("start", func(t *testing.T) {
		pgfailover.Start(t, pgfailover.Options{})
		started = true
	})
	if started || !ran {
		t.Fatalf("Start with PG_BINDIR pointing nowhere: started=%v passed=%v, want a skip", started, ran)
	}
}
