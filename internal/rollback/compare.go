package rollback

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Loss is one writer's witness that Postgres no longer has: the writer
// committed (and the value was seen outside Postgres) at least Witnessed,
// and the ledger's row now says Ledger (0: the row itself is gone).
type Loss struct {
	Writer    string
	Ledger    int64
	Witnessed int64
}

// Commits is how many of the writer's witnessed transactions are gone.
func (l Loss) Commits() int64 { return l.Witnessed - l.Ledger }

func (l Loss) String() string {
	return fmt.Sprintf("%s: ledger at %d, witnessed %d (%d commits lost)", l.Writer, l.Ledger, l.Witnessed, l.Commits())
}

// Compare is the detection rule, pure: every witnessed value above what the
// ledger holds is a loss. Values the ledger holds above what was witnessed
// are progress, not evidence. Sorted by writer.
func Compare(ledger, witnessed map[string]int64) []Loss {
	var out []Loss
	for w, seen := range witnessed {
		if have := ledger[w]; seen > have {
			out = append(out, Loss{Writer: w, Ledger: have, Witnessed: seen})
		}
	}
	slices.SortFunc(out, func(a, b Loss) int { return strings.Compare(a.Writer, b.Writer) })
	return out
}

// Evidence is the losses in one line, for the alert, the log and
// ledger_rollbacks.evidence.
func Evidence(losses []Loss) string {
	parts := make([]string, len(losses))
	for i, l := range losses {
		parts[i] = l.String()
	}
	return strings.Join(parts, "; ")
}

// LostSince is where the repair starts reading Stripe: every lost commit
// came after the last one that survived in the ledger's write-ahead log, so
// after the newest witness stamp the ledger still holds (lastSurvivor),
// less margin for transactions that began before it and for clock skew.
// With no surviving stamp (a ledger restored from before any witness), the
// repair reads back as far as fallback.
func LostSince(lastSurvivor time.Time, margin time.Duration, fallback time.Time) time.Time {
	if lastSurvivor.IsZero() {
		return fallback
	}
	return lastSurvivor.Add(-margin)
}
