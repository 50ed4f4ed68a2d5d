//go:build !linux

package teamsys

import "syscall"

// sysProcAttr: only Linux has a parent-death signal; cleanup still kills.
func sysProcAttr() *syscall.SysProcAttr { return nil }
