package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// stopWithGoRun asks the kernel for a SIGTERM when the go command that runs jetgres under
// `go run` exits. The go command lets a terminal's Ctrl-C reach jetgres through the process
// group, but a SIGTERM sent to the go command alone kills only it, and jetgres and its
// PostgreSQL would run on, orphaned. Any other parent is left alone: a shell that started
// jetgres in the background may well exit while jetgres is meant to keep running. It reports
// whether the parent is the go command.
//
// The setting belongs to the calling thread, and the signal is sent while any thread that made
// it lives; the Go runtime ends a thread only under a goroutine locked to it, and this one is
// not.
func stopWithGoRun() (bool, error) {
	ppid := os.Getppid()
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || strings.TrimSpace(string(comm)) != "go" {
		return false, nil
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0); errno != 0 {
		return true, fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", errno)
	}
	// The go command may have exited before the setting took effect; then no signal comes.
	if os.Getppid() != ppid {
		return true, syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	return true, nil
}
