package rediscluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/internal/ledger"
)

// TestShardFailover is issue 10's acceptance run: N events (10,000; 2,000
// with -short; PELGUARD_CLUSTER_EVENTS overrides both) over six hash-tagged streams
// billing-stream:{0..5} on a local 3-master/3-replica cluster, a consumer per
// stream (8 workers, COUNT 50) and one reaper (min-idle 1s) across all six,
// the Stripe emulator at 2 ms a request. Part-way, the master holding
// billing-stream:{0} is SIGKILLed (appendfsync everysec, asynchronous
// replication: the promoted replica may lack the last acks, group cursor
// moves and PEL claims — "AOF rollback" at shard scale). The run continues
// through CLUSTERDOWN, refused connections and the topology change, and
// must end with exactly one charge per key, every PEL drained and every
// ledger row terminal.
func TestShardFailover(t *testing.T) {
	t.Parallel()
	n := 10_000 // ~75 s under -race on 2 cores
	if testing.Short() {
		n = 2_000
	}
	n = envInt("PELGUARD_CLUSTER_EVENTS", n)
	c := startCluster(t)
	rdb := c.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	o := worldOpts{streams: 6, latency: 2 * time.Millisecond, workers: 8, count: 50}
	w := newWorld(t, rdb, "billing-stream", o)
	victim, err := c.MasterOf(ctx, w.streams[0])
	if err != nil {
		t.Fatal(err)
	}
	var onVictim []string
	for _, s := range w.streams {
		if m, err := c.MasterOf(ctx, s); err == nil && m == victim {
			onVictim = append(onVictim, s)
		}
	}
	t.Logf("killing %s part-way; it is master of %v", victim.Addr(), onVictim)

	w.produce(t, n)
	// Producers on a cluster must not count on an XADD the master accepted
	// but had not replicated when it died: make sure every event is on the
	// replicas too (in production: WAIT 1 after XADD, or re-publish; a
	// duplicate entry is harmless, the ledger absorbs it).
	if err := c.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	w.start(t, o, time.Second)

	// Part-way: a third of the events charged.
	deadline := time.Now().Add(60 * time.Second)
	for {
		counts, err := w.ledger.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if counts[ledger.StatusCharged] >= n/3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a third of %d events not charged after 60s: %v", n, counts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	killedAt := time.Since(start)
	c.Kill(victim)
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(start) - killedAt
	newMaster, err := c.MasterOf(ctx, w.streams[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL at %s; replica %s promoted, cluster_state:ok after %s", killedAt.Round(time.Millisecond), newMaster.Addr(), promoted.Round(time.Millisecond))

	w.waitSettled(t, n, 5*time.Minute)
	elapsed := time.Since(start)
	w.stop(t)

	// Exactly one charge per key: per (customer, period) at the emulator,
	// and no duplicate group at all.
	if d := w.sim.Duplicates(); len(d) != 0 {
		t.Fatalf("%d duplicate charge groups, first %+v", len(d), d[0])
	}
	// One pass over the emulator's charges (SucceededCharges per key would
	// be quadratic): succeeded, unrefunded charges per (customer, period).
	perKey := map[string]int{}
	for _, ch := range w.sim.Charges() {
		if ch.Status == "succeeded" && ch.AmountRefunded < ch.Amount && ch.Metadata["billing_period"] == period {
			perKey[ch.Metadata["customer_id"]]++
		}
	}
	if len(perKey) != n {
		t.Errorf("charges name %d keys, want %d", len(perKey), n)
	}
	missing := 0
	for i := range n {
		if got := perKey[event0(i).CustomerID]; got != 1 {
			missing++
			if missing <= 5 {
				t.Errorf("%s: %d succeeded charges, want 1", event0(i).CustomerID, got)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d keys without exactly one charge", missing, n)
	}
	counts, err := w.ledger.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts[ledger.StatusCharged] != n || len(counts) != 1 {
		t.Fatalf("ledger = %v, want %d charged and nothing else", counts, n)
	}
	for _, s := range w.streams {
		if l, err := rdb.XLen(ctx, consumer.DeadLetterStream(s)).Result(); err != nil || l != 0 {
			t.Errorf("%s: %d dead letters (%v), want none", consumer.DeadLetterStream(s), l, err)
		}
	}
	t.Logf("%d events over %d streams in %s (%.0f events/s incl. the failover); Stripe charge creates %d (same-key retries included)",
		n, len(w.streams), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), w.sim.ChargeCreates())
	t.Logf("consumer outcomes %v", w.outcomes(t, "pelguard_consumer_events_total"))
	t.Logf("reaper decisions %v", w.outcomes(t, "pelguard_reaper_decisions_total"))
	t.Logf("heartbeats %v", w.outcomes(t, "pelguard_consumer_heartbeats_total"))
}
