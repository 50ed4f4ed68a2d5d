package cli_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Only a commit that waits for a named standby survives a failover to it.
func TestDurabilitySynchronous(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		commit, standbys string
		want             bool
	}{
		{"on", "", false},
		{"on", "ANY 1 (replica1, replica2)", true},
		{"remote_apply", "replica1", true},
		{"remote_write", "FIRST 1 (replica1)", true},
		{"local", "replica1", false},
		{"off", "replica1", false},
	} {
		d := cli.Durability{SynchronousCommit: c.commit, SynchronousStandbyNames: c.standbys}
		if d.Synchronous() != c.want {
			t.Errorf("synchronous_commit=%s synchronous_standby_names=%q: synchronous %v, want %v", c.commit, c.standbys, !c.want, c.want)
		}
	}
}

// Issue 26 ("say what the ledger needs"): every role reads the primary's
// replication settings at start, warns when a failover can lose commits,
// and exports the mode. The Postgres the tests start has no synchronous
// standby; one given by DATABASE_URL may, and is then reported so.
func TestReportDurabilitySaysWhatAFailoverCanLose(t *testing.T) {
	t.Parallel()
	pool := testenv.DB(t)
	ctx := context.Background()
	d, err := cli.ReadDurability(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	cli.ReportDurability(ctx, pool, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	out := logs.String()
	wantLevel, wantText, wantValue := "level=WARN", "can lose the last ledger writes", 0.0
	if d.Synchronous() {
		wantLevel, wantText, wantValue = "level=INFO", "keeps every ledger write", 1
	}
	if !strings.Contains(out, wantLevel) || !strings.Contains(out, wantText) ||
		!strings.Contains(out, "synchronous_commit="+d.SynchronousCommit) {
		t.Fatalf("settings %+v, log: %s", d, out)
	}
	if n, err := testutil.GatherAndCount(reg, "pelguard_ledger_synchronous_replication"); err != nil || n != 1 {
		t.Fatalf("metric: %d series, %v", n, err)
	}
	mfs, _ := reg.Gather()
	if v := mfs[0].GetMetric()[0].GetGauge().GetValue(); v != wantValue {
		t.Fatalf("settings %+v: the metric says %v", d, v)
	}
}
