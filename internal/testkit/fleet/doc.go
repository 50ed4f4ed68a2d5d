// Package fleet tests and benchmarks a pelguard fleet in one test process:
// several consumers, a reaper and an auditor, each with its own Redis
// client, Postgres pool, Stripe client and rate limiter (what separate
// processes have), against the Stripe emulator behind a stripesim.Meter.
// It holds no code of its own: see the _test files.
//
// Benchmarks (make bench, or go test -run '^$' -bench . -benchtime 1x ./internal/fleet/):
//
//   - BenchmarkFleet: 3 consumers + the reaper re-driving + an auditor run
//     against the emulator limiting at 100 requests/s with 300 ms latency;
//     "shared" is --stripe-rate 100 shared through Redis, "control" is
//     today's per-process limit (each process at 100/s). Size:
//     PELGUARD_BENCH_FLEET_EVENTS (default 6000).
//   - BenchmarkBillCustomers: time to bill PELGUARD_BENCH_CUSTOMERS
//     (default 20000) customers at 100 requests/s in charges mode, with the
//     fleet's Postgres connections sampled from pg_stat_activity.
package fleet
