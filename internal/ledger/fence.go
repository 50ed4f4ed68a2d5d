package ledger

// The epoch floor (ledger_fence.epoch_floor, migration 00012): every epoch
// the ledger hands out is above it. A failover that erased commits can have
// erased epochs too, and the same epoch would otherwise be handed out twice
// (a row lost and inserted again starts over): raising the floor past every
// epoch the lost history could have issued (RaiseFence) means a holder from
// before the failover never passes a fenced write.
const (
	// EpochFloorSQL is the floor, for statements of other packages that
	// hand out epochs (the reaper's external leases).
	EpochFloorSQL = `coalesce((SELECT epoch_floor FROM {schema}.ledger_fence), 0)`
	// firstEpoch is a new row's epoch.
	firstEpoch = `(` + EpochFloorSQL + ` + 1)`
	// nextEpoch is a takeover's: past the row's and past the floor.
	nextEpoch = `(greatest(epoch, ` + EpochFloorSQL + `) + 1)`
)
