package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// queuesOnDifferentNodes finds two queue names whose hash tags live on different masters.
func queuesOnDifferentNodes(t *testing.T, cc *redis.ClusterClient) (string, string) {
	t.Helper()
	ctx := context.Background()
	l := queue.NewLayout("")
	first := ""
	firstAddr := ""
	for i := 0; i < 100; i++ {
		q := fmt.Sprintf("cq%d", i)
		node, err := cc.MasterForKey(ctx, l.Meta(q))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case first == "":
			first, firstAddr = q, node.Options().Addr
		case node.Options().Addr != firstAddr:
			return first, q
		}
	}
	t.Fatal("no two queues on different nodes")
	return "", ""
}

// TestQueueClusterTwoQueuesOnDifferentNodes writes two queues living on different cluster nodes
// through the output (cluster_urls), consumes both through the input, and checks every message
// once in order; a batch spanning both queues is refused with code crossslot and writes nothing.
func TestQueueClusterTwoQueuesOnDifferentNodes(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	cc := rc.Client(t)
	ctx := context.Background()
	qa, qb := queuesOnDifferentNodes(t, cc)
	urls := ""
	for _, a := range rc.Addrs() {
		urls += fmt.Sprintf("\n    - redis://%s", a)
	}
	send, stop := produce(t, fmt.Sprintf(`
redis_queue:
  cluster_urls: %s
  queue: ${! meta("q") }
  partition: ${! meta("p") }
  id: ${! meta("id") }
  shards: 4
  max_in_flight: 1
`, urls))
	defer stop()
	const perQueue = 60
	for _, q := range []string{qa, qb} {
		for i := 0; i < perQueue; i += 20 {
			if err := send(ctx, batchOf(20, i, map[string]string{"q": q})); err != nil {
				t.Fatalf("write %s: %v", q, err)
			}
		}
	}
	mixed := append(batchOf(2, 1000, map[string]string{"q": qa}), batchOf(2, 1002, map[string]string{"q": qb})...)
	if err := send(ctx, mixed); !errcode.Is(err, errcode.CrossSlot) {
		t.Fatalf("a batch over two queues on different nodes: %v", err)
	}

	// fence and cover on the cluster, under qa's tag: stale fence refused, repeated cover a duplicate
	w := queue.NewWriter(cc, queue.WriterConfig{})
	leaseKey, ptrKey := "pgrelay:{"+qa+"}:src:s:lease", "pgrelay:{"+qa+"}:src:s:ptr"
	cc.Set(ctx, leaseKey, "owner|7", 0)
	one := []queue.Message{{Queue: qa, Partition: "p0", ID: "m-covered", Payload: []byte(`{}`)}}
	cover := &queue.Cover{LeaseKey: leaseKey, Fence: "owner|7", PointerKey: ptrKey, Pointer: []byte(`{"pos":"1"}`), Pos: "1"}
	if _, err := w.Write(ctx, one, &queue.Cover{LeaseKey: leaseKey, Fence: "owner|6"}); !errcode.Is(err, errcode.Fenced) {
		t.Fatalf("stale fence on the cluster: %v", err)
	}
	if res, err := w.Write(ctx, one, cover); err != nil || res != queue.ResultOK {
		t.Fatalf("covered write: %v %v", res, err)
	}
	if res, err := w.Write(ctx, one, cover); err != nil || res != queue.ResultDuplicate {
		t.Fatalf("repeated cover: %v %v", res, err)
	}

	for _, q := range []string{qa, qb} {
		want := perQueue
		if q == qa {
			want++ // m-covered
		}
		var mu sync.Mutex
		var got []string
		b := service.NewStreamBuilder()
		b.SetLoggerYAML("level: warn")
		if err := b.AddInputYAML(fmt.Sprintf(`
redis_queue:
  cluster_urls: %s
  queue: %s
  group: g
  block: 100ms
`, urls, q)); err != nil {
			t.Fatal(err)
		}
		stop := cdctest.RunConsumer(t, b, func(_ context.Context, batch service.MessageBatch) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				id, _ := m.MetaGet("message_id")
				got = append(got, id)
			}
			return nil
		})
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		lastByPartition := map[int]int{}
		for _, id := range got {
			if id == "m-covered" && !seen[id] {
				seen[id] = true
				continue
			}
			var n int
			fmt.Sscanf(id, "m%d", &n)
			if seen[id] || n >= perQueue {
				t.Fatalf("queue %s: unexpected %s (seen before: %v)", q, id, seen[id])
			}
			seen[id] = true
			if prev, ok := lastByPartition[n%3]; ok && n < prev {
				t.Fatalf("queue %s: partition p%d out of order: %d after %d", q, n%3, n, prev)
			}
			lastByPartition[n%3] = n
		}
		if len(seen) != want {
			t.Fatalf("queue %s: consumed %d of %d", q, len(seen), want)
		}
	}
}
