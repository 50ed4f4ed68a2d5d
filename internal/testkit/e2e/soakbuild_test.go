//go:build pelguard_soak

package e2e

// soakBuild: `make soak` runs this package with -tags pelguard_soak, so
// TestMain builds the binaries with the same tag (the reaper then accepts
// a --stream-retention of minutes) and TestSoak runs.
const soakBuild = true
