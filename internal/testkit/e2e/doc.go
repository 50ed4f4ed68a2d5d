// Package e2e runs the pelguard binaries (consumer, reaper, auditor) as real
// subprocesses against real Redis and Postgres and the Stripe emulator, and
// checks what an operator and a platform team rely on: no secret ever
// reaches their output (invariant 7), Stripe key governance (sk_live_
// refused, rk_ accepted, a 403 fails fast and alerts), every metric the
// Grafana dashboard names exists, and the deploy/ manifests and units only
// use flags and probe paths the binaries really have. TestSoak (`make soak`,
// -tags pelguard_soak) runs the fleet for minutes and checks nothing grows
// and nothing is lost or doubled; it skips otherwise. It has only tests.
package e2e
