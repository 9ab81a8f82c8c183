package queue_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/benchenv"
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
				// the entry as the output writes it (layout version 2)
				meta := fmt.Sprintf(`{"off":%d,"p":%q,"id":%q,"tx":"","ts":0}`, j, part, id)
				p.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream("raw", queue.Shard(part, 16)), Values: []any{
					queue.FieldMeta, meta, queue.FieldPayload, payload}})
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
	queue.RawReadAll(b, rdb, l, "raw", 16, total, 500)
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

// BenchmarkOutputPluginCPU measures this process' CPU per message of the redis_queue output, for
// messages shaped as pg_cdc hands them over (a source batch with a cover in the context, eight
// metadata keys, ~230-byte payloads, 1,000 per batch), against an output plugin that does
// nothing, fed the same messages in the same run, alternating batch by batch: own_us/msg is the
// output's own work (converting the batch, encoding the transaction, reading the replies, and
// waiting for them) above what any output plugin costs in Benthos. Redis (AOF off) runs in its
// own process and is not counted. All batches are built before the measured windows.
// PGRELAY_BENCH_ONLY=queue (or noop) sends every batch to that output, for a profile of it alone.
func BenchmarkOutputPluginCPU(b *testing.B) {
	r := testenv.StartRedis(b, "--appendonly", "no")
	ctx := context.Background()
	start := func(out string) func(context.Context, service.MessageBatch) error {
		sb := service.NewStreamBuilder()
		sb.SetLoggerYAML("level: warn")
		send, err := sb.AddBatchProducerFunc()
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.AddOutputYAML(out); err != nil {
			b.Fatal(err)
		}
		s, err := sb.Build()
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = s.Run(ctx) }()
		b.Cleanup(func() { _ = s.StopWithin(5 * time.Second) })
		return send
	}
	toQueue := start(fmt.Sprintf("redis_queue:\n  url: %s\n  max_in_flight: 1\n", r.URL()))
	toNoop := start("pgrelay_bench_noop: {}\n")
	switch os.Getenv("PGRELAY_BENCH_ONLY") {
	case "queue":
		toNoop = toQueue
	case "noop":
		toQueue = toNoop
	}
	lease, ptr := "pgrelay:{cq}:src:s:lease", "pgrelay:{cq}:src:s:ptr"
	if err := r.Client().Set(ctx, lease, "me|1", 0).Err(); err != nil {
		b.Fatal(err)
	}
	const size = 1000
	payload := []byte(`{"op":"r","table":"public.bench","key":{"id":1},"after":{"v":"` + strings.Repeat("x", 150) + `","n":1.5}}`)
	batches := func(from int) []service.MessageBatch {
		out := make([]service.MessageBatch, b.N)
		for i := range out {
			n := from + i
			pos := fmt.Sprintf("%016x", n+1)
			sbatch := &queue.SourceBatch{Cover: queue.Cover{LeaseKey: lease, Fence: "me|1", PointerKey: ptr,
				Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}, Receipt: queue.NewCoverReceipt(pos)}
			tmpl := service.NewMessage(nil).WithContext(queue.WithSourceBatch(ctx, sbatch))
			tx := "pg:e:" + pos
			var queueV, txV, opV, tableV, lsnV, created any = "cq", tx, "r", "public.bench", "0/16B3748", "1790000000000"
			batch := make(service.MessageBatch, size)
			for j := range batch {
				m := tmpl.Copy()
				m.SetBytes(payload)
				m.MetaSetMut("queue", queueV)
				m.MetaSetMut("partition", strconv.Itoa(n*size+j))
				m.MetaSetMut("message_id", tx+":"+strconv.Itoa(j))
				m.MetaSetMut("transaction_id", txV)
				m.MetaSetMut("op", opV)
				m.MetaSetMut("table", tableV)
				m.MetaSetMut("lsn", lsnV)
				m.MetaSetMut("created_at", created)
				batch[j] = m
			}
			out[i] = batch
		}
		return out
	}
	qb, nb := batches(0), batches(b.N)
	runtime.GC()
	var ms runtime.MemStats
	measure := func(send func(context.Context, service.MessageBatch) error, batch service.MessageBatch) (time.Duration, uint64) {
		runtime.ReadMemStats(&ms)
		c0, a0 := benchenv.SelfCPU(), ms.Mallocs
		if err := send(ctx, batch); err != nil {
			b.Fatal(err)
		}
		c1 := benchenv.SelfCPU()
		runtime.ReadMemStats(&ms)
		return c1 - c0, ms.Mallocs - a0
	}
	var queueCPU, noopCPU time.Duration
	var queueAllocs, noopAllocs uint64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, a := measure(toQueue, qb[i])
		queueCPU, queueAllocs = queueCPU+c, queueAllocs+a
		c, a = measure(toNoop, nb[i])
		noopCPU, noopAllocs = noopCPU+c, noopAllocs+a
		qb[i], nb[i] = nil, nil
	}
	b.StopTimer()
	n := float64(b.N * size)
	b.ReportMetric(float64(queueCPU.Microseconds())/n, "queue_us/msg")
	b.ReportMetric(float64(noopCPU.Microseconds())/n, "noop_us/msg")
	b.ReportMetric(float64((queueCPU-noopCPU).Microseconds())/n, "own_us/msg")
	b.ReportMetric((float64(queueAllocs)-float64(noopAllocs))/n, "own_allocs/msg")
}

func init() {
	// an output plugin that writes nothing: what any output plugin costs through Benthos' public API
	service.MustRegisterBatchOutput("pgrelay_bench_noop", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			return noopOutput{}, service.BatchPolicy{}, 1, nil
		})
}

type noopOutput struct{}

func (noopOutput) Connect(context.Context) error                          { return nil }
func (noopOutput) WriteBatch(context.Context, service.MessageBatch) error { return nil }
func (noopOutput) Close(context.Context) error                            { return nil }
