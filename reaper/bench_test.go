package reaper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/reaper"
)

// benchEntries is the PEL size of the benchmark (the 100,000);
// -short uses 10,000.
func benchEntries() int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

// mix says what each seeded entry is. Every entry is decided without a
// Stripe call except claim, which the reaper re-drives.
type mix struct {
	gone, invalid, leaseLive, claim int // per 1000; the rest are already billed
}

// BenchmarkReaper measures entries decided per second by one reaper pass
// over a PEL of 100,000 abandoned entries, and by a naive XAUTOCLAIM loop
// over an identical PEL in the same run (the seeds' monitor with a no-op
// handler that acks what it claims). Goal: ≥ 20,000/s and ≥ 0.5× naive.
//
//	go test -run '^$' -bench BenchmarkReaper -benchtime 1x -count 5 ./reaper/
func BenchmarkReaper(b *testing.B) {
	for _, set := range []struct {
		name string
		mix  mix
	}{
		{"all_billed", mix{}},
		// 3% trimmed, 2% invalid, 1% held by a live lease, 0.1% re-driven
		// through Stripe, the rest billed.
		{"mixed", mix{gone: 30, invalid: 20, leaseLive: 10, claim: 1}},
	} {
		b.Run(set.name, func(b *testing.B) { benchBoth(b, set.mix) })
	}
}

// benchBoth alternates the two loops over identical PELs, so that both see
// the same machine load, and reports both rates and their ratio.
func benchBoth(b *testing.B, m mix) {
	b.StopTimer() // setup (schema, migrations) and seeding are not measured
	bb := setup(b)
	n := benchEntries()
	var decided, naiveDecided int
	var elapsed, naiveElapsed time.Duration
	for range b.N {
		bb.seedPEL(b, n, m, true)
		cfg := bb.config(b, "reaper-bench")
		cfg.Logger, cfg.OnDecision, cfg.PageSize, cfg.Workers = testenv.Discard(), nil, 1000, 16
		r := bb.newReaper(b, cfg)
		b.StartTimer()
		start := time.Now()
		sum, err := r.RunOnce(context.Background())
		elapsed += time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		decided += sum.Scanned
		if m == (mix{}) && sum.Decisions[reaper.KindAlreadyBilled] != n {
			b.Fatalf("decisions %v", sum.Decisions)
		}

		bb.seedPEL(b, n, m, false)
		start = time.Now()
		naiveDecided += naiveXAutoClaim(b, bb.rdb, bb.stream, bb.group, time.Millisecond, 1000)
		naiveElapsed += time.Since(start)
	}
	rate, naive := float64(decided)/elapsed.Seconds(), float64(naiveDecided)/naiveElapsed.Seconds()
	b.ReportMetric(rate, "entries/s")
	b.ReportMetric(naive, "naive_entries/s")
	b.ReportMetric(rate/naive, "x_naive")
}

// naiveXAutoClaim is the baseline: the seeds' stuck-message monitor, an
// XAUTOCLAIM loop with no ledger check, here with a no-op handler that acks
// each claimed entry. It exists only to be measured against; pelguard never
// uses XAUTOCLAIM.
func naiveXAutoClaim(b *testing.B, rdb *redis.Client, stream, group string, minIdle time.Duration, count int64) int {
	ctx := context.Background()
	start := "0-0"
	for {
		cmd := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: stream, Group: group, Consumer: "naive-monitor",
			MinIdle: minIdle, Start: start, Count: count})
		msgs, next, err := cmd.Result()
		if err != nil {
			b.Fatal(err)
		}
		if len(msgs) > 0 {
			ids := make([]string, len(msgs))
			for i, msg := range msgs {
				ids[i] = msg.ID // the handler: nothing, then ack
			}
			if err := rdb.XAck(ctx, stream, group, ids...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if next == "0-0" {
			break
		}
		start = next
	}
	// Redis 7 drops deleted entries from the PEL inside XAUTOCLAIM without
	// returning them: count every entry the PEL lost.
	left, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		b.Fatal(err)
	}
	return benchEntries() - int(left.Count)
}

// seedPEL builds a fresh stream whose n entries were all read by a consumer
// that then died, and (withLedger) the ledger rows that say what each one is.
func (bb *bundle) seedPEL(b *testing.B, n int, m mix, withLedger bool) {
	b.Helper()
	ctx := context.Background()
	bb.stream = testenv.Name(b, "bench")
	testenv.CleanupKeys(b, bb.rdb, bb.stream, consumer.DeadLetterStream(bb.stream))
	if err := consumer.EnsureGroup(ctx, bb.rdb, bb.stream, bb.group); err != nil {
		b.Fatal(err)
	}
	kindOf := func(i int) string {
		switch j := i % 1000; {
		case j < m.gone:
			return "gone"
		case j < m.gone+m.invalid:
			return "invalid"
		case j < m.gone+m.invalid+m.leaseLive:
			return "lease"
		case j < m.gone+m.invalid+m.leaseLive+m.claim:
			return "claim"
		}
		return "billed"
	}
	var rows [][]any
	now := time.Now()
	ids := make([]*redis.StringCmd, n)
	for lo := 0; lo < n; lo += 10_000 {
		pipe := bb.rdb.Pipeline()
		for i := lo; i < min(n, lo+10_000); i++ {
			e := ev(i)
			payload := e.Payload()
			if kindOf(i) == "invalid" {
				payload = `{"customer_id":"` + e.CustomerID + `"}`
			}
			ids[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: bb.stream, Values: map[string]any{"payload": payload}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := consumer.Register(ctx, bb.rdb, bb.stream, bb.group, deadName, time.Now()); err != nil {
		b.Fatal(err)
	}
	if err := bb.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: bb.group, Consumer: deadName,
		Streams: []string{bb.stream, ">"}, Count: int64(n), Block: -1}).Err(); err != nil {
		b.Fatal(err)
	}
	var gone []string
	for i := range n {
		e := ev(i)
		key := event.IdempotencyKey(e.CustomerID, e.BillingPeriod, testNamespace)
		switch kindOf(i) {
		case "gone":
			gone = append(gone, ids[i].Val())
		case "billed":
			rows = append(rows, []any{e.CustomerID, e.BillingPeriod, e.StripeCustomerID, e.AmountCents, e.Currency,
				key, "charged", "ch_seed_" + key, nil, nil, now, now})
		case "lease":
			rows = append(rows, []any{e.CustomerID, e.BillingPeriod, e.StripeCustomerID, e.AmountCents, e.Currency,
				key, "pending", nil, "stalled-consumer", now.Add(time.Hour), now, nil})
		}
	}
	for lo := 0; lo < len(gone); lo += 10_000 {
		if err := bb.rdb.XDel(ctx, bb.stream, gone[lo:min(len(gone), lo+10_000)]...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if withLedger {
		// Test-only shortcut: COPY straight into billing_records, bypassing
		// the ledger package, because 100,000 Reserve+Finish round trips
		// would take minutes. Production code never writes the table
		// except through internal/ledger.
		if _, err := bb.pool.Exec(ctx, `TRUNCATE billing_records`); err != nil {
			b.Fatal(err)
		}
		if _, err := bb.pool.CopyFrom(ctx, pgx.Identifier{"billing_records"},
			[]string{"customer_id", "billing_period", "stripe_customer_id", "amount_cents", "currency",
				"idempotency_key", "status", "charge_id", "lease_owner", "lease_expires_at", "first_attempt_at", "charged_at"},
			pgx.CopyFromRows(rows)); err != nil {
			b.Fatal(fmt.Errorf("seeding billing_records: %w", err))
		}
	}
	bb.waitIdle(b, n-len(gone), time.Millisecond)
}
