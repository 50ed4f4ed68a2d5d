package rediscluster_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// BenchmarkClusterVsSingle bills b.N events over six hash-tagged streams
// (a consumer per stream, 8 workers, COUNT 50, and the reaper across all
// six; emulator latency 0), once on a local 3-master/3-replica cluster and
// once on the single node REDIS_URL names, in the same run. Each reports
// events/s from the first read until every stream is drained and every
// ledger row terminal.
//
// One op is 3,000 events, so make bench's -benchtime 1x measures something:
//
//	go test -run '^$' -bench BenchmarkClusterVsSingle -benchtime 1x -count 3 ./internal/rediscluster/
func BenchmarkClusterVsSingle(b *testing.B) {
	o := worldOpts{streams: 6, workers: 8, count: 50}
	c := startCluster(b)
	crdb := c.Client()
	b.Cleanup(func() { _ = crdb.Close() })
	run := func(b *testing.B, rdb redis.UniversalClient) {
		w := newWorld(b, rdb, testenv.Name(b, "bench"), o)
		w.logger = testenv.Discard()
		n := 3000 * b.N
		w.produce(b, n)
		b.ResetTimer()
		start := time.Now()
		w.start(b, o, time.Minute)
		w.waitSettled(b, n, 10*time.Minute)
		elapsed := time.Since(start)
		b.StopTimer()
		w.stop(b)
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	}
	b.Run("cluster", func(b *testing.B) { run(b, crdb) })
	b.Run("single", func(b *testing.B) { run(b, testenv.Redis(b)) })
}
