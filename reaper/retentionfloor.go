//go:build !pelguard_soak

package reaper

import "time"

// soakRetentionFloor replaces MinStreamRetention when positive. Production
// builds have none: the floor is the safe window plus the repair's reach.
// Only the soak's builds (make soak, tag pelguard_soak) lower it, so that
// retention cycles fit in minutes; see retentionfloor_soak.go.
const soakRetentionFloor time.Duration = 0
