package cdctest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWriters: every writer runs until stop, wait counts the calls that reported a commit, and a
// pause of 0 never sleeps (nor asks the generator for one).
func TestWriters(t *testing.T) {
	for _, c := range []struct{ writers, pause int }{{1, 0}, {2, 3}, {4, 1}} {
		t.Run(fmt.Sprintf("%d writers pause %d", c.writers, c.pause), func(t *testing.T) {
			stop := make(chan struct{})
			var calls, commits atomic.Int64
			seen := sync.Map{}
			wait := Writers(7, c.writers, c.pause, stop, func(rng *rand.Rand) bool {
				seen.Store(rng, true)
				calls.Add(1)
				if rng.IntN(2) == 0 {
					commits.Add(1)
					return true
				}
				return false
			})
			Wait(t, 10*time.Second, "every writer to run", func() (bool, string) {
				n := 0
				seen.Range(func(any, any) bool { n++; return true })
				return n == c.writers && calls.Load() > 20, fmt.Sprintf("%d writers, %d calls", n, calls.Load())
			})
			close(stop)
			if got := wait(); int64(got) != commits.Load() {
				t.Fatalf("wait returned %d, %d commits reported", got, commits.Load())
			}
			n := calls.Load()
			time.Sleep(20 * time.Millisecond)
			if calls.Load() != n {
				t.Fatal("a writer ran after wait returned")
			}
		})
	}
}
