// Package retry paces the loops that try again: the source's lease and session loops and the
// queue consumer's shard loops wait between attempts with Sleep, and spread replicas apart with
// Jitter so they do not retry in step.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Sleep waits d, or less if ctx is done first. It reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Jitter returns a duration drawn evenly from 80 % to 120 % of d.
func Jitter(d time.Duration) time.Duration {
	return d*8/10 + time.Duration(rand.Int64N(int64(d)*4/10+1))
}
