package queue_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
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

// BenchmarkInputPlugin measures the whole redis_queue input (Benthos plugin into a batch consumer
// that acks at once) reading b.N batches of 500 messages of 200 bytes, against raw XREADGROUP COUNT
// 500 + XACK of the same messages, in the same run.
func BenchmarkInputPlugin(b *testing.B) {
	r := testenv.StartRedis(b, "--appendonly", "no")
	rdb := r.Client()
	ctx := context.Background()
	l := queue.NewLayout("")
	w := queue.NewWriter(rdb, queue.WriterConfig{Shards: 16})
	payload := []byte(`{"data":"` + strings.Repeat("x", 189) + `"}`)
	for i := 0; i < b.N; i++ {
		for _, q := range []string{"raw", "iq"} {
			msgs := make([]queue.Message, 500)
			for j := range msgs {
				msgs[j] = queue.Message{Queue: q, Partition: "p" + strconv.Itoa(j%64), ID: strconv.Itoa(i*500 + j), Payload: payload}
			}
			if _, err := w.Write(ctx, msgs, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	total := b.N * 500
	for n := 0; n < 16; n++ {
		rdb.XGroupCreate(ctx, l.Stream("raw", n), "g", "0")
	}
	b.ResetTimer()
	t0 := time.Now()
	for got, n := 0, 0; got < total; n = (n + 1) % 16 {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: queue.ConsumerName(n),
			Streams: []string{l.Stream("raw", n), ">"}, Count: 500, Block: -1}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, len(res[0].Messages))
		for i, m := range res[0].Messages {
			ids[i] = m.ID
		}
		if len(ids) > 0 {
			rdb.XAck(ctx, l.Stream("raw", n), "g", ids...)
		}
		got += len(ids)
	}
	rawDur := time.Since(t0)

	sb := service.NewStreamBuilder()
	sb.SetLoggerYAML("level: warn")
	if err := sb.AddInputYAML(fmt.Sprintf("redis_queue:\n  url: %s\n  queue: iq\n  group: g\n  batch_count: 500\n  block: 50ms\n", r.URL())); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	var got atomic.Int64
	if err := sb.AddBatchConsumerFunc(func(_ context.Context, batch service.MessageBatch) error {
		if got.Add(int64(len(batch))) == int64(total) {
			close(done)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	s, err := sb.Build()
	if err != nil {
		b.Fatal(err)
	}
	t0 = time.Now()
	go func() { _ = s.Run(ctx) }()
	<-done
	pluginDur := time.Since(t0)
	b.StopTimer()
	_ = s.StopWithin(5 * time.Second)
	b.ReportMetric(float64(total)/rawDur.Seconds(), "raw-msgs/s")
	b.ReportMetric(float64(total)/pluginDur.Seconds(), "input-msgs/s")
	b.ReportMetric(rawDur.Seconds()/pluginDur.Seconds(), "ratio")
}
