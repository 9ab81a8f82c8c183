//go:build !unix

package proctune

import "time"

// ProcessCPU cannot read the process's CPU time here (false): the tuner does not start.
func ProcessCPU() (time.Duration, bool) { return 0, false }
