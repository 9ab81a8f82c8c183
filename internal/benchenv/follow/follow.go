// Package follow reads a queue as the benchmarks' consumers do, to time commit → queue.
package follow

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/queue"
)

// Queue reads queue q (16 shards, key prefix "pgrelay") from the entries written after it
// started until ctx ends, calling seen with each change event's payload and the time the blocking
// XREAD that returned it came back: a benchmark's commit → queue latency.
func Queue(ctx context.Context, rdb *redis.Client, q string, seen func(payload string, now time.Time)) {
	l := queue.NewLayout("pgrelay")
	var streams, ids []string
	for sh := 0; sh < 16; sh++ {
		st := l.Stream(q, sh)
		streams = append(streams, st)
		id := "0"
		if tail, err := rdb.XRevRangeN(ctx, st, "+", "-", 1).Result(); err == nil && len(tail) == 1 {
			id = tail[0].ID
		}
		ids = append(ids, id)
	}
	for ctx.Err() == nil {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: append(append([]string{}, streams...), ids...), Block: 200 * time.Millisecond, Count: 1000}).Result()
		if err != nil {
			continue // redis.Nil: nothing new; ctx ended: the loop stops
		}
		now := time.Now()
		for _, st := range res {
			for k, name := range streams {
				if name == st.Stream && len(st.Messages) > 0 {
					ids[k] = st.Messages[len(st.Messages)-1].ID
				}
			}
			for _, msg := range st.Messages {
				for _, e := range queue.EntriesOf(nil, msg) {
					seen(string(e.Payload), now)
				}
			}
		}
	}
}

// Latencies collects commit → read latencies of change events: the time a blocking XREAD
// returned each event less its ts. Seen is Queue's callback; safe for concurrent use.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Seen records the event in payload, read at now (events without a ts are skipped).
func (l *Latencies) Seen(payload string, now time.Time) {
	var ev struct{ TS string }
	if json.Unmarshal([]byte(payload), &ev) != nil {
		return
	}
	ts, err := time.Parse(time.RFC3339Nano, ev.TS)
	if err != nil {
		return
	}
	l.mu.Lock()
	l.d = append(l.d, now.Sub(ts))
	l.mu.Unlock()
}

// Len is how many latencies were recorded.
func (l *Latencies) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// Percentile is the q-quantile (0 ≤ q < 1) of the latencies recorded (0 when none was).
func (l *Latencies) Percentile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[min(len(l.d)-1, int(float64(len(l.d))*q))]
}
