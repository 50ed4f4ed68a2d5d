package rollback

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	detected prometheus.Counter
	rebuilt  prometheus.Counter
	open     prometheus.Gauge
	rechecks prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		detected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_ledger_rollbacks_detected_total",
			Help: "Ledger rollbacks (commits lost by a failover or a restore) this process detected and recorded.",
		}),
		rebuilt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_ledger_rows_rebuilt_total",
			Help: "Ledger rows this process rebuilt or brought in line from Stripe after a rollback.",
		}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pelguard_ledger_rollback_open",
			Help: "1 while a ledger rollback is recorded and not yet repaired: every charge asks Stripe first.",
		}),
		rechecks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pelguard_ledger_server_rechecks_total",
			Help: "Rollback checks run because a ledger write met a Postgres server the last check had not run on (a failover or restart behind a connection pooler); the write waited for the check.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.detected, m.rebuilt, m.open, m.rechecks)
	}
	return m
}

func (m *metrics) setOpen(open bool) {
	if open {
		m.open.Set(1)
	} else {
		m.open.Set(0)
	}
}
