package teamsys

import "syscall"

// sysProcAttr makes the kernel SIGKILL the team's process if the test binary
// dies without running its cleanups (a panic in another goroutine, go test's
// timeout): no orphan keeps consuming a stream after its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
