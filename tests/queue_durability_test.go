package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestQueueAOFSurvivesRedisSIGKILL: with durability aof, every batch the output acknowledged is
// still there after redis-server is killed with SIGKILL and restarted.
func TestQueueAOFSurvivesRedisSIGKILL(t *testing.T) {
	r := testenv.StartRedis(t) // appendonly yes, appendfsync always
	ctx := context.Background()
	send, stop := produce(t, fmt.Sprintf(`
redis_queue:
  url: %s
  queue: durable
  partition: ${! meta("p") }
  id: ${! meta("id") }
  durability: aof
  max_in_flight: 4
`, r.URL()))
	defer stop()
	acked := make(chan int, 10000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i += 10 {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := send(sctx, batchOf(10, i, nil))
			cancel()
			if err != nil {
				return // the server is gone
			}
			acked <- i
		}
	}()
	for len(acked) < 50 {
		time.Sleep(5 * time.Millisecond)
	}
	r.Kill() // SIGKILL while batches are being written
	<-done
	close(acked)
	r.Restart()
	rdb := r.Client()
	have := map[string]bool{}
	for n := 0; n < queue.DefaultShards; n++ {
		xs, err := rdb.XRange(ctx, queue.NewLayout("").Stream("durable", n), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range xs {
			for _, e := range queue.EntriesOf(nil, x) {
				have[e.MessageID] = true
			}
		}
	}
	batches := 0
	for i := range acked {
		batches++
		for j := i; j < i+10; j++ {
			if !have[fmt.Sprintf("m%d", j)] {
				t.Fatalf("acknowledged message m%d lost after SIGKILL of redis-server", j)
			}
		}
	}
	t.Logf("%d acknowledged batches, all present after the restart (%d messages kept)", batches, len(have))
}
