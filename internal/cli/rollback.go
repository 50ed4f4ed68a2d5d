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
// description and metadata setting, each run's report logged.
func LedgerRepair(pool *pgxpool.Pool, schema string, sc *stripeapi.Client, namespace string, desc func(event.Event) string,
	unmarked bool, by string, logger *slog.Logger) rollback.RepairFunc {
	l := ledger.New(pool, schema, nil)
	return func(ctx context.Context, since time.Time) (rollback.RepairReport, error) {
		rep, err := repair.Run(ctx, repair.Config{Ledger: l, Stripe: sc, Since: since, Namespace: namespace, By: by,
			Description: desc, UnmarkedCharges: unmarked, Logger: logger})
		return rollback.RepairReport{Rebuilt: rep.Rebuilt, Repaired: rep.Repaired, RefundsRebuilt: rep.RefundsRebuilt,
			Findings: rep.Findings, Notes: strings.Join(rep.Notes, "\n")}, err
	}
}
