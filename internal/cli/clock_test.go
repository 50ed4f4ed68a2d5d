package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Skew is measured against the real Postgres: this host is in step with it
// (both run here), and a host clock shifted by a minute either way is read
// as a minute ahead or behind and refused with a message naming the fix.
func TestCheckClock(t *testing.T) {
	t.Parallel()
	pool := testenv.DB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		shift time.Duration
		word  string
	}{{time.Minute, "ahead of"}, {-time.Minute, "behind"}} {
		now := func() time.Time { return time.Now().Add(tc.shift) }
		skew, err := pg.ClockSkew(ctx, pool, now)
		if err != nil {
			t.Fatal(err)
		}
		if d := skew - tc.shift; d < -time.Second || d > time.Second {
			t.Errorf("shift %s: skew %s", tc.shift, skew)
		}
		err = checkClock(ctx, pool, 10*time.Second, "a third of --lease", now)
		var u *UsageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.word) || !strings.Contains(err.Error(), "NTP") {
			t.Errorf("shift %s: %v, want a usage error saying %q and naming NTP", tc.shift, err, tc.word)
		}
	}
	if err := CheckClock(ctx, pool, 10*time.Second, "a third of --lease"); err != nil {
		t.Fatalf("this host against its own Postgres: %v", err)
	}
}

func TestMaxDBConns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flag, want int
		got        int32
		bad        bool
	}{
		{0, 8, 8, false}, {0, 132, DefaultMaxDBConns, false}, {40, 132, 40, false}, {2, 132, 2, false},
		{1, 8, 0, true}, {-3, 8, 0, true},
	} {
		got, err := MaxDBConns(c.flag, c.want)
		if (err != nil) != c.bad || got != c.got {
			t.Errorf("MaxDBConns(%d, %d) = %d, %v", c.flag, c.want, got, err)
		}
	}
}
