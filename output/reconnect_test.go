package output

import (
	"testing"
	"time"
)

// TestPaceDelay: a down output's reconnects wait 100 ms, doubling, at most 5 s; a write that
// reaches the server starts the next outage from 100 ms again.
func TestPaceDelay(t *testing.T) {
	for _, c := range []struct {
		n    int32
		want time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{5, 3200 * time.Millisecond},
		{6, 5 * time.Second},
		{40, 5 * time.Second},
	} {
		if got := paceDelay(c.n); got != c.want {
			t.Errorf("paceDelay(%d) = %s, want %s", c.n, got, c.want)
		}
	}
	var r reconnect
	r.tries.Store(4)
	r.wrote()
	if r.tries.Load() != 0 {
		t.Errorf("after a write the count is %d, want 0", r.tries.Load())
	}
}
