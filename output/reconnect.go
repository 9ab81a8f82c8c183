package output

import (
	"context"
	"sync/atomic"
	"time"
)

// pingWithin bounds Connect's check that PostgreSQL (pg_sink) or Redis (redis_queue) answers again.
const pingWithin = 5 * time.Second

// reconnectPace spaces the reconnects of an output that reported not connected after a write could
// not reach its server. Benthos calls Connect, then writes the batch again at once; the server may
// answer Connect's ping while the write still fails (a Redis Cluster node other than the one pinged,
// a connection the pool kept), and without a pause the two would alternate as fast as they fail.
// Each reconnect with no write in between waits longer: 100 ms, doubling, at most 5 s.
type reconnectPace struct{ n atomic.Int32 }

// paceDelay is the pause before the reconnect that follows n others with no write between them.
func paceDelay(n int32) time.Duration {
	return min(100*time.Millisecond<<min(n, 6), 5*time.Second)
}

// wait sleeps before a reconnect (not past ctx).
func (p *reconnectPace) wait(ctx context.Context) {
	t := time.NewTimer(paceDelay(p.n.Add(1) - 1))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// wrote records a write that reached the server: the next outage starts from the shortest pause.
func (p *reconnectPace) wrote() {
	if p.n.Load() != 0 {
		p.n.Store(0)
	}
}
