// Package testkit gathers what pelguard's tests use and nothing ships:
// the harnesses that start real Redis, Postgres and Stripe emulators per
// test (testenv, rediscluster, pgfailover), the team systems the switch
// is tested against (teamsys), the end-to-end and fleet tests (e2e,
// fleet), stripe-mock's shape checks (stripemocktest), the public-API
// guard (apicheck), the documentation's own tests (docstest) and the
// reference-page generator (refdocs). No package outside testkit imports
// these from non-test code (pgfailover's TestOnlyImportedByTests checks
// its own; the binaries link none of them).
package testkit
