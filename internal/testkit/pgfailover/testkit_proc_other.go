//go:build unix && !linux

package pgfailover

import "syscall"

// procAttr runs a server program as u (no Pdeathsig off Linux: a killed
// test binary can leave servers behind there).
func procAttr(u runAs) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{}
	if u.asRoot {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
