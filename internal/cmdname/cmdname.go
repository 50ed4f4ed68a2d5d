// Package cmdname names the commands an operator types: the installed
// binaries (`make build`, `make install`, the image and the units all give
// these names). Help texts, alerts, log hints and errors that tell someone
// what to run build the command from these constants, so that what they
// print can be pasted as it is; TestNamedCommandsParse
// (internal/testkit/refdocs) checks every command named in help, alerts
// and docs against the binaries' real flag sets.
package cmdname

const (
	Consumer = "pelguard-consumer"
	Reaper   = "pelguard-reaper"
	Auditor  = "pelguard-auditor"
	Console  = "pelguard-console"
	// Stripesim and Chaos keep the names `make build` gives them: they are
	// tools for trying pelguard, not installed with it.
	Stripesim = "stripesim"
	Chaos     = "chaos"
)
