package queue_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
	_ "github.com/pgrelay/pgrelay/output"
)

// BenchmarkOutputPlugin measures the whole redis_queue output (Benthos plugin: interpolation of
// queue, partition and id, then the write script) on batches of 500 messages of 200 bytes, against
// raw pipelined XADD of the same messages in the same run.
func BenchmarkOutputPlugin(b *testing.B) {
	r := testenv.StartRedis(b, "--appendonly", "no")
	rdb := r.Client()
	ctx := context.Background()
	sb := service.NewStreamBuilder()
	sb.SetLoggerYAML("level: warn")
	send, err := sb.AddBatchProducerFunc()
	if err != nil {
		b.Fatal(err)
	}
	if err := sb.AddOutputYAML(fmt.Sprintf(`
redis_queue:
  url: %s
  queue: pq
  partition: ${! meta("partition") }
  id: ${! meta("message_id") }
  max_in_flight: 1
`, r.URL())); err != nil {
		b.Fatal(err)
	}
	s, err := sb.Build()
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.Run(ctx) }()
	defer s.StopWithin(5 * time.Second)
	payload := []byte(`{"data":"` + strings.Repeat("x", 189) + `"}`)
	l := queue.NewLayout("")
	var rawDur, pluginDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch := make(service.MessageBatch, 500)
		for j := range batch {
			n := i*500 + j
			m := service.NewMessage(payload)
			m.MetaSetMut("partition", "p"+strconv.Itoa(n%64))
			m.MetaSetMut("message_id", "pg:00000001:"+strconv.Itoa(n))
			batch[j] = m
		}
		t0 := time.Now()
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, m := range batch {
				part, _ := m.MetaGet("partition")
				id, _ := m.MetaGet("message_id")
				p.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream("raw", queue.Shard(part, 16)), Values: []any{
					"off", j, "p", part, "id", id, "tx", "", "ts", 0, "h", "", "d", payload}})
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		rawDur += time.Since(t0)
		t0 = time.Now()
		if err := send(ctx, batch); err != nil {
			b.Fatal(err)
		}
		pluginDur += time.Since(t0)
	}
	b.StopTimer()
	n := float64(b.N * 500)
	b.ReportMetric(n/rawDur.Seconds(), "raw-msgs/s")
	b.ReportMetric(n/pluginDur.Seconds(), "output-msgs/s")
	b.ReportMetric(rawDur.Seconds()/pluginDur.Seconds(), "ratio")
}
