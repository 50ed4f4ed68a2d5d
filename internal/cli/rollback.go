package cli

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/rollback"
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
