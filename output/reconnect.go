package output

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// pingWithin bounds Connect's check that PostgreSQL (pg_sink) or Redis (redis_queue) answers again.
const pingWithin = 5 * time.Second

// reconnect is an output's record of a write that could not reach its server (pg_unreachable,
// redis_unreachable). Such a write is not a failed batch: the output reports not connected, so
// /ready answers 503 and Benthos calls Connect, which waits until the server answers a ping, then
// writes the same batch again. Reconnects are paced: the server may answer the ping while the
// write still fails (a Redis Cluster node other than the one pinged, a connection a pool kept),
// and without a pause the two would alternate as fast as they fail. Each reconnect with no write
// reaching the server in between waits longer: 100 ms, doubling, at most 5 s.
type reconnect struct {
	down  atomic.Bool
	tries atomic.Int32 // reconnects since a write last reached the server
}

// lost records a write that could not reach the server and returns service.ErrNotConnected.
func (r *reconnect) lost(log *service.Logger, err error) error {
	log.Warnf("%v; waiting for it, then writing the batch again", err)
	r.down.Store(true)
	return service.ErrNotConnected
}

// wrote records a write that reached the server: the next outage starts from the shortest pause.
func (r *reconnect) wrote() {
	if r.tries.Load() != 0 {
		r.tries.Store(0)
	}
}

// await is Connect's part once a write was lost: after the pause, ping (bounded by pingWithin)
// until the server answers. Without a lost write it returns nil at once.
func (r *reconnect) await(ctx context.Context, ping func(context.Context) error) error {
	if !r.down.Load() {
		return nil
	}
	t := time.NewTimer(paceDelay(r.tries.Add(1) - 1))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	pctx, cancel := context.WithTimeout(ctx, pingWithin)
	defer cancel()
	if err := ping(pctx); err != nil {
		return err
	}
	r.down.Store(false)
	return nil
}

// paceDelay is the pause before the reconnect that follows n others with no write between them.
func paceDelay(n int32) time.Duration {
	return min(100*time.Millisecond<<min(n, 6), 5*time.Second)
}
