//go:build unix

package proctune

import (
	"syscall"
	"time"
)

// ProcessCPU is the process's CPU time so far (user and system, every thread), from getrusage.
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
