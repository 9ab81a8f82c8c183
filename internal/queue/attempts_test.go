package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestAttemptsPerShard: the entries of different shards written by one script get the same
// stream id (one frozen clock, a sequence per stream), so the failed attempts of one shard's entry
// must not count for another shard's entry with that id. Each entry fails once with
// max_attempts 2: none may be dead-lettered, and each redelivery must say 1 attempt.
func TestAttemptsPerShard(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := NewWriter(rdb, WriterConfig{Shards: 2})
	if _, err := w.Write(ctx, msgs("q", 8, 8), nil); err != nil {
		t.Fatal(err)
	}
	first := map[int]string{}
	for n := 0; n < 2; n++ {
		xs, err := rdb.XRangeN(ctx, w.Layout().Stream("q", n), "-", "+", 1).Result()
		if err != nil || len(xs) == 0 {
			t.Fatalf("shard %d: %v %v", n, xs, err)
		}
		first[n] = xs[0].ID
	}
	if first[0] != first[1] {
		t.Skipf("first ids differ (%s, %s): no collision to test", first[0], first[1])
	}
	c := newConsumer(t, rdb, ConsumerConfig{BatchCount: 1, MaxAttempts: 2})
	failedOnce := map[int]bool{}
	redelivered := map[int]int64{}
	deadline := time.Now().Add(15 * time.Second)
	for len(redelivered) < 2 && time.Now().Before(deadline) {
		d := read(t, c, 10*time.Second)
		e := d.Entries[0]
		if e.ID != first[d.Shard] {
			t.Fatalf("shard %d moved on to %s: its entry %s was dead-lettered after one failure (dead letters: %d)",
				d.Shard, e.ID, first[d.Shard], rdb.XLen(ctx, w.Layout().DLQ("q")).Val())
		}
		if !failedOnce[d.Shard] {
			failedOnce[d.Shard] = true
			if err := c.Nack(ctx, d, map[int]error{0: errors.New("bad")}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		redelivered[d.Shard] = e.Attempts
		// hold this delivery (no ack) so the other shard's entry is failed meanwhile
		if len(redelivered) == 2 {
			break
		}
	}
	dlq := rdb.XLen(ctx, w.Layout().DLQ("q")).Val()
	if dlq != 0 {
		t.Errorf("%d entries dead-lettered after one failure each with max_attempts 2", dlq)
	}
	for n := 0; n < 2; n++ {
		if a, ok := redelivered[n]; !ok || a != 1 {
			t.Errorf("shard %d: redelivered %v with attempts %d, want 1", n, ok, a)
		}
	}
}
