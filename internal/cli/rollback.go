package cli

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/repair"
	"github.com/pelguard/pelguard/internal/rollback"
	"github.com/pelguard/pelguard/stripeapi"
)

// NewRollback is a process's ledger witness (DESIGN.md "The ledger's own
// losses"): give its AfterConnect to NewDB, then Startup.Rollback (or call
// Start). Its row is named role/name, or role/host-pid when name is empty.
// rdb may be nil (the webhook receiver, an auditor without --redis-url):
// the process's memory witnesses alone.
func NewRollback(role, name, schema string, rdb redis.UniversalClient, n alerts.Notifier, logger *slog.Logger, reg prometheus.Registerer) (*rollback.Monitor, error) {
	host, _ := os.Hostname()
	writer := role + "/" + cmp.Or(name, fmt.Sprintf("%s-%d", cmp.Or(host, "host"), os.Getpid()))
	return rollback.New(rollback.Config{Schema: schema, Writer: writer, Redis: rdb, Notifier: n, Logger: logger, Registry: reg})
}

// LedgerRepair is the repair of a role that bills (consumer, reaper): the
// lost rows rebuilt from Stripe through sc, with the role's namespace,
// description and metadata setting, then the meter events' rows restored
// from the meter witness in rdb (every meter stream registered for the
// ledger, whichever role runs it), each run's report logged. A nil rdb
// repairs charges only.
func LedgerRepair(pool *pgxpool.Pool, schema string, sc *stripeapi.Client, rdb redis.UniversalClient, namespace string,
	desc func(event.Event) string, unmarked bool, by string, logger *slog.Logger) rollback.RepairFunc {
	l := ledger.New(pool, schema, nil)
	return func(ctx context.Context, since time.Time) (rollback.RepairReport, error) {
		rep, err := repair.Run(ctx, repair.Config{Ledger: l, Stripe: sc, Since: since, Namespace: namespace, By: by,
			Description: desc, UnmarkedCharges: unmarked, Logger: logger})
		out := rollback.RepairReport{Rebuilt: rep.Rebuilt, Repaired: rep.Repaired, RefundsRebuilt: rep.RefundsRebuilt,
			Findings: rep.Findings, Notes: strings.Join(rep.Notes, "\n")}
		if err != nil || rdb == nil {
			return out, err
		}
		ml, err := meterledger.New(pool, meterledger.Config{Schema: schema})
		if err != nil {
			return out, err
		}
		u, err := repair.Usage(ctx, repair.UsageConfig{Ledger: ml, Redis: rdb, Since: since, Until: rollback.FoundAt(ctx), By: by, Logger: logger})
		return AddUsage(out, u, err)
	}
}

// AddUsage adds a usage repair's report to a charge repair's: restored
// meter event rows count as rebuilt, rows set back to their outcome as
// repaired, and what it could not restore (parked events, conflicts, a
// witness too short) as findings, named in the notes.
func AddUsage(r rollback.RepairReport, u repair.UsageReport, err error) (rollback.RepairReport, error) {
	r.Rebuilt += u.Restored
	r.Repaired += u.Repaired
	r.Findings += u.Findings
	if len(u.Notes) > 0 {
		r.Notes = strings.TrimPrefix(r.Notes+"\n"+strings.Join(u.Notes, "\n"), "\n")
	}
	return r, err
}
