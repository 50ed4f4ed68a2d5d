//go:build !pelguard_soak

package e2e

// soakBuild is false in ordinary test runs: the binaries are the
// production ones and TestSoak skips, naming `make soak`.
const soakBuild = false
