// Package follow reads a queue as the benchmarks' consumers do, to time commit → queue.
package follow

import (
	"context"
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
