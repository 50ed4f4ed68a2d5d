package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Durability is how the ledger's Postgres replicates its commits: what a
// failover can take back. Postgres is pelguard's truth (every Redis loss is
// harmless because of it), so each role says at start what it runs on.
type Durability struct {
	// SynchronousCommit and SynchronousStandbyNames are the server's
	// settings of those names.
	SynchronousCommit       string
	SynchronousStandbyNames string
	// Standbys is how many streaming replicas the server reports.
	Standbys int
}

// Synchronous reports whether a commit waits for a standby: only then does
// a failover to that standby keep every commit pelguard was told of.
func (d Durability) Synchronous() bool {
	switch d.SynchronousCommit {
	case "on", "remote_write", "remote_apply":
		return strings.TrimSpace(d.SynchronousStandbyNames) != ""
	}
	return false
}

// Advice is the sentence the start-up log line carries.
func (d Durability) Advice() string {
	if d.Synchronous() {
		return "commits wait for a synchronous standby: a failover to it keeps every ledger write"
	}
	return "commits do not wait for a standby: a failover to an asynchronous replica (Patroni's default, a promoted read " +
		"replica) can lose the last ledger writes, which pelguard relies on; managed HA whose storage is synchronous " +
		"(RDS Multi-AZ instances, Aurora, Cloud SQL HA) does not. See docs/operations/failover.md"
}

// ReadDurability reads the server's replication settings.
func ReadDurability(ctx context.Context, pool *pgxpool.Pool) (Durability, error) {
	var d Durability
	err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication)::int`).Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.Standbys)
	if err != nil {
		return Durability{}, fmt.Errorf("reading the ledger's replication settings: %w", err)
	}
	return d, nil
}

// ReportDurability logs the ledger's replication mode (a warning when a
// failover can lose commits) and exports it as
// pelguard_ledger_synchronous_replication on reg (nil: no metric). A
// failure to read it is logged, never fatal: it informs, it guards nothing.
func ReportDurability(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) {
	d, err := ReadDurability(ctx, pool)
	if err != nil {
		logger.WarnContext(ctx, "could not read the ledger's replication settings", slog.Any("error", err))
		return
	}
	attrs := []any{slog.String("synchronous_commit", d.SynchronousCommit),
		slog.String("synchronous_standby_names", d.SynchronousStandbyNames), slog.Int("standbys", d.Standbys),
		slog.Bool("synchronous", d.Synchronous())}
	if d.Synchronous() {
		logger.InfoContext(ctx, "ledger durability: "+d.Advice(), attrs...)
	} else {
		logger.WarnContext(ctx, "ledger durability: "+d.Advice(), attrs...)
	}
	if reg == nil {
		return
	}
	g := DurabilityGauge(d)
	if err := reg.Register(g); err != nil {
		logger.WarnContext(ctx, "could not export the ledger's replication mode", slog.Any("error", err))
	}
}

// DurabilityGauge is pelguard_ledger_synchronous_replication for d.
func DurabilityGauge(d Durability) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pelguard_ledger_synchronous_replication",
		Help: "1 when the ledger's commits wait for a synchronous standby (a failover to it loses none), 0 when a failover to a replica can lose the last commits; read at start. Labels: the server's settings.",
		ConstLabels: prometheus.Labels{"synchronous_commit": d.SynchronousCommit,
			"synchronous_standby_names": d.SynchronousStandbyNames},
	})
	if d.Synchronous() {
		g.Set(1)
	}
	return g
}
