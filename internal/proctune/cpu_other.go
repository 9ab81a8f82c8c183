//go:build !unix

package proctune

import "time"

// processCPU cannot read the process's CPU time here: the tuner does not start.
func processCPU() (time.Duration, bool) { return 0, false }
