package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// The unsent backlog of a meter consumer sending from the ledger
// (SendFromLedger). A count meter's events cannot be aggregated (Stripe
// counts events), so each keeps a call of its own, one at a time per
// customer and meter: a customer above about one event per call latency
// on such a meter never delays anyone else, but its own backlog does not
// catch up. The pending entries no longer show it (they are acked at
// ingest); these gauges do, per meter, and PelguardMeterBacklogBehind
// (deploy/prometheus) alerts on them.

// BacklogEvery is how often a meter consumer sending from the ledger reads
// its stream's unsent backlog for its gauges.
const BacklogEvery = 15 * time.Second

// meterBacklogMetrics are the backlog gauges, by stream and meter.
type meterBacklogMetrics struct {
	queued, busiest, oldest *prometheus.GaugeVec

	mu sync.Mutex
	// known are the meters each stream has published: a meter whose
	// backlog is gone is set to 0, not dropped, so a rule sees it end.
	known map[string]map[string]bool
}

func newMeterBacklogMetrics(reg prometheus.Registerer) *meterBacklogMetrics {
	labels := []string{"stream", "event_name"}
	m := &meterBacklogMetrics{
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_consumer_meter_unsent_events",
			Help: "Meter events recorded in the ledger and not yet sent (queued), by stream and meter; meter consumers with --send-from-ledger, read every 15 s (each consumer of a stream reports the same ledger: take max).",
		}, labels),
		busiest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_consumer_meter_unsent_busiest_events",
			Help: "The most queued meter events of one customer on the meter: one call at a time per customer and meter, so this is the backlog that drains at one event per Stripe call latency.",
		}, labels),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pelguard_consumer_meter_unsent_oldest_seconds",
			Help: "How long the meter's oldest queued event has been in the ledger unsent (0: nothing queued).",
		}, labels),
		known: map[string]map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.queued, m.busiest, m.oldest)
	}
	return m
}

// meterBacklog publishes stream's backlog as of now.
func (m *Metrics) meterBacklog(stream string, bs []meterledger.MeterBacklog, now time.Time) {
	if m == nil {
		return
	}
	g := m.backlog
	g.mu.Lock()
	defer g.mu.Unlock()
	known := g.known[stream]
	if known == nil {
		known = map[string]bool{}
		g.known[stream] = known
	}
	seen := map[string]bool{}
	for _, b := range bs {
		seen[b.EventName], known[b.EventName] = true, true
		g.queued.WithLabelValues(stream, b.EventName).Set(float64(b.Queued))
		g.busiest.WithLabelValues(stream, b.EventName).Set(float64(b.Busiest))
		g.oldest.WithLabelValues(stream, b.EventName).Set(max(now.Sub(b.Oldest).Seconds(), 0))
	}
	for name := range known {
		if !seen[name] {
			for _, v := range []*prometheus.GaugeVec{g.queued, g.busiest, g.oldest} {
				v.WithLabelValues(stream, name).Set(0)
			}
		}
	}
}

// watchBacklogWhileRunning publishes the backlog now and every
// BacklogEvery until the returned function is called, which waits for the
// last read to end. Only a consumer sending from the ledger with metrics
// has one to publish.
func (c *MeterConsumer) watchBacklogWhileRunning(ctx context.Context) (stop func()) {
	if !c.cfg.SendFromLedger || c.cfg.Metrics == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(BacklogEvery)
		defer t.Stop()
		for {
			if err := c.publishBacklog(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("reading the unsent meter backlog", "stream", c.cfg.Stream, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// publishBacklog reads the stream's unsent backlog per meter from the
// ledger and sets the gauges; a failed read leaves them as they were.
func (c *MeterConsumer) publishBacklog(ctx context.Context) error {
	bs, err := c.ledger.BacklogByMeter(ctx, c.cfg.Stream)
	if err != nil {
		return err
	}
	c.cfg.Metrics.meterBacklog(c.cfg.Stream, bs, c.cfg.Clock.Now())
	return nil
}
