package teamsys

import (
	"strings"
	"testing"
)

// CI must never pass by skipping the team's system: without Python it fails.
func TestUnavailableFailsUnderCIAndSaysHowToInstall(t *testing.T) {
	t.Parallel()
	for _, ci := range []bool{false, true} {
		fatal, msg := unavailable("no module named stripe", ci)
		if fatal != ci {
			t.Errorf("CI=%v: fatal %v, want %v", ci, fatal, ci)
		}
		if !strings.Contains(msg, "apt-get install -y python3-redis python3-psycopg2 python3-stripe") ||
			!strings.Contains(msg, "no module named stripe") {
			t.Errorf("CI=%v: message %q should name the problem and the install command", ci, msg)
		}
	}
}
