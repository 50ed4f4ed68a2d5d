package pgfailover

import "syscall"

// procAttr runs a server program as u. Pdeathsig kills a postmaster whose
// test binary died without running t.Cleanup (a panic, a -timeout), so no
// server outlives the run on a shared machine; its backends then exit on
// postmaster death.
func procAttr(u runAs) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if u.asRoot {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
