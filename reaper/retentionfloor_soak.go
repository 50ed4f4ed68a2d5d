//go:build pelguard_soak

package reaper

import "time"

// soakRetentionFloor: in binaries built for the soak (make soak builds
// pelguard-reaper with -tags pelguard_soak) --stream-retention may go down
// to a minute, so that a 30-minute run sees many retention cycles. Never
// in a release: the Makefile's build, install and image targets do not
// pass the tag, and a production reaper keeps the real floor (the safe
// window plus the ledger repair's reach, 24h05m by default).
const soakRetentionFloor = time.Minute
