package cdctest

import (
	"testing"
	"time"
)

// DefaultPoll is how often Wait asks its condition.
const DefaultPoll = 50 * time.Millisecond

// Wait asks cond every DefaultPoll until it reports done. If timeout passes first, it fails tb
// (Fatalf) naming what it waited for and the state cond reported last. cond returns whether the
// wait is over and, when it is not, a short description of what it saw instead.
func Wait(tb testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) {
	tb.Helper()
	WaitEvery(tb, timeout, DefaultPoll, what, cond)
}

// WaitEvery is Wait asking every `every` (for conditions that are costly to ask, or that change
// slowly).
func WaitEvery(tb testing.TB, timeout, every time.Duration, what string, cond func() (done bool, state string)) {
	tb.Helper()
	if ok, last := Poll(timeout, every, cond); !ok {
		tb.Fatalf("timed out after %s waiting for %s (last state: %s)", timeout, what, last)
	}
}

// Poll asks cond every `every` until it reports done or timeout passes, and returns whether it
// was done and the state it reported last. It asks at least once, and once more after the
// deadline, so a condition that holds by then is never reported as timed out. Callers that must
// explain a timeout before failing use it instead of Wait.
func Poll(timeout, every time.Duration, cond func() (done bool, state string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return true, state
		}
		if time.Now().After(deadline) {
			return false, state
		}
		time.Sleep(every)
	}
}
