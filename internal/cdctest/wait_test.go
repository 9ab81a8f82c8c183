package cdctest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeTB records Fatalf and Errorf instead of failing the test, so Wait's failure and
// StopAndWait's reports can be checked.
type fakeTB struct {
	testing.TB
	failed string
	errors []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func TestPoll(t *testing.T) {
	cases := []struct {
		name     string
		doneAt   int // the call that first reports done (0: never)
		timeout  time.Duration
		wantOK   bool
		minCalls int
	}{
		{name: "at once", doneAt: 1, timeout: time.Second, wantOK: true, minCalls: 1},
		{name: "after a few", doneAt: 4, timeout: 5 * time.Second, wantOK: true, minCalls: 4},
		{name: "never", doneAt: 0, timeout: 30 * time.Millisecond, wantOK: false, minCalls: 2},
		{name: "zero timeout asks once", doneAt: 1, timeout: 0, wantOK: true, minCalls: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			ok, last := Poll(c.timeout, time.Millisecond, func() (bool, string) {
				calls++
				return calls == c.doneAt, "call " + strconv.Itoa(calls)
			})
			if ok != c.wantOK || calls < c.minCalls {
				t.Fatalf("ok %v after %d calls (last %q), want %v after at least %d", ok, calls, last, c.wantOK, c.minCalls)
			}
			if last != "call "+strconv.Itoa(calls) {
				t.Errorf("last state %q, want the last call's (%d)", last, calls)
			}
		})
	}
}

func TestWaitFailsWithWhatAndLastState(t *testing.T) {
	f := &fakeTB{TB: t}
	n := 0
	WaitEvery(f, 20*time.Millisecond, time.Millisecond, "the pointer", func() (bool, string) {
		n++
		return false, "seen " + strconv.Itoa(n)
	})
	if !strings.Contains(f.failed, "waiting for the pointer") || !strings.Contains(f.failed, "last state: seen "+strconv.Itoa(n)) {
		t.Fatalf("failure message %q", f.failed)
	}
	f.failed = ""
	Wait(f, time.Second, "done", func() (bool, string) { return true, "" })
	if f.failed != "" {
		t.Fatalf("Wait failed on a condition that holds: %s", f.failed)
	}
}
