package reapercli

import "github.com/pelguard/pelguard/internal/cli"

// Program is the binary's command list, as Main dispatches it: the
// reference generator (internal/refdocs) reads each command's name and
// summary here and its flags from its own --help.
func Program() *cli.Program { return program() }
