package queue

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

const benchBatch = 500

var benchPayload = []byte(`{"data":"` + strings.Repeat("x", 189) + `"}`) // 200 bytes

func benchMsgs(q string, from int) []Message {
	out := make([]Message, benchBatch)
	for i := range out {
		n := from + i
		out[i] = Message{Queue: q, Partition: "p" + strconv.Itoa(n%64), ID: "pg:00000001:" + strconv.Itoa(n),
			Tx: "pg:00000001:tx", CreatedMs: 1700000000000, Payload: benchPayload}
	}
	return out
}

// rawXAdd writes msgs with one pipeline of XADDs carrying the same fields the output writes (layout
// version 2: m and d): the baseline of what Redis itself costs.
func rawXAdd(ctx context.Context, rdb *redis.Client, l Layout, msgs []Message) error {
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range msgs {
			m := &msgs[i]
			p.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream(m.Queue, Shard(m.Partition, 16)), Values: []any{
				FieldMeta, appendMeta(nil, int64(i), m), FieldPayload, m.Payload}})
		}
		return nil
	})
	return err
}

// benchRedisArgs is the write benchmark's Redis: AOF off, or with PGRELAY_BENCH_FSYNC=always
// (or everysec) appendonly yes with that appendfsync, for the raw baseline and the script alike.
func benchRedisArgs() []string {
	if f := os.Getenv("PGRELAY_BENCH_FSYNC"); f != "" {
		return []string{"--appendonly", "yes", "--appendfsync", f}
	}
	return []string{"--appendonly", "no"}
}

// BenchmarkOutput compares Writer.Write (the redis_queue output's write: one script call per
// batch of 500 messages of 200 bytes, fenced and moving a pointer) with raw pipelined XADD of the
// same messages, alternating in the same run. Reported: msgs/s of each and their ratio.
func BenchmarkOutput(b *testing.B) {
	r := testenv.StartRedis(b, benchRedisArgs()...)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 16})
	lease, ptr := "pgrelay:{bq}:src:s:lease", "pgrelay:{bq}:src:s:ptr"
	rdb.Set(ctx, lease, "me|1", 0)
	if _, err := w.Write(ctx, benchMsgs("bq", 0), nil); err != nil { // load the script, create meta
		b.Fatal(err)
	}
	var rawDur, scriptDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		msgs := benchMsgs("raw", i*benchBatch)
		t0 := time.Now()
		if err := rawXAdd(ctx, rdb, l, msgs); err != nil {
			b.Fatal(err)
		}
		rawDur += time.Since(t0)
		msgs = benchMsgs("bq", i*benchBatch)
		pos := fmt.Sprintf("%016x", i+1)
		cover := &Cover{LeaseKey: lease, Fence: "me|1", PointerKey: ptr, Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}
		t0 = time.Now()
		if res, err := w.Write(ctx, msgs, cover); err != nil || res != ResultOK {
			b.Fatal(res, err)
		}
		scriptDur += time.Since(t0)
	}
	b.StopTimer()
	n := float64(b.N * benchBatch)
	b.ReportMetric(n/rawDur.Seconds(), "raw-msgs/s")
	b.ReportMetric(n/scriptDur.Seconds(), "output-msgs/s")
	b.ReportMetric(rawDur.Seconds()/scriptDur.Seconds(), "ratio")
}

// BenchmarkInput compares the Consumer (Read + Ack of deliveries of up to 500 entries) with raw
// XREADGROUP COUNT 500 + XACK over the same shards, on queues filled beforehand.
func BenchmarkInput(b *testing.B) {
	r := testenv.StartRedis(b, "--appendonly", "no")
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 16})
	for i := 0; i < b.N; i++ {
		for _, q := range []string{"raw", "cq"} {
			if _, err := w.Write(ctx, benchMsgs(q, i*benchBatch), nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	total := b.N * benchBatch
	for n := 0; n < 16; n++ {
		rdb.XGroupCreate(ctx, l.Stream("raw", n), "g", "0")
	}
	b.ResetTimer()
	t0 := time.Now()
	RawReadAll(b, rdb, l, "raw", 16, total, benchBatch)
	rawDur := time.Since(t0)
	c, err := NewConsumer(rdb, ConsumerConfig{Queue: "cq", Group: "g", BatchCount: benchBatch, Block: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	t0 = time.Now()
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for got := 0; got < total; {
		d, err := c.Read(ctx)
		if err != nil {
			b.Fatal(err)
		}
		got += len(d.Entries)
		if err := c.Ack(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
	consumerDur := time.Since(t0)
	b.StopTimer()
	_ = c.Close(ctx)
	b.ReportMetric(float64(total)/rawDur.Seconds(), "raw-msgs/s")
	b.ReportMetric(float64(total)/consumerDur.Seconds(), "input-msgs/s")
	b.ReportMetric(rawDur.Seconds()/consumerDur.Seconds(), "ratio")
}

// BenchmarkEntryLayout measures what the entry layout costs the Redis server: the same 200-byte
// payloads XADDed in plain pipelines of 1,000, once in layout version 1 (the seven fields of
// DESIGN §4: off, p, id, tx, ts, h, d) and once in version 2 (m, the JSON object of the same
// values, and d). Redis' cost per entry grows with the number of arguments (parsing, the stream's
// listpack, and with the AOF on, each argument appended again). It also reports each layout's
// memory per entry (MEMORY USAGE of the streams over the entries written). Same Redis settings as
// BenchmarkOutput (PGRELAY_BENCH_FSYNC).
func BenchmarkEntryLayout(b *testing.B) {
	r := testenv.StartRedis(b, benchRedisArgs()...)
	rdb := r.Client()
	ctx := context.Background()
	payload := benchPayload
	msg := func(i int) *Message {
		return &Message{Partition: "p" + strconv.Itoa(i%64), ID: "pg:00000001:" + strconv.Itoa(i), Tx: "pg:00000001:tx",
			CreatedMs: 1700000000000, Payload: payload}
	}
	layouts := []struct {
		name string
		vals func(i int) []any
	}{
		{"v1", func(i int) []any {
			m := msg(i)
			return []any{FieldOffset, i, FieldPartition, m.Partition, FieldID, m.ID, FieldTx, m.Tx,
				FieldCreated, m.CreatedMs, FieldHeader, "", FieldPayload, m.Payload}
		}},
		{"v2", func(i int) []any {
			m := msg(i)
			return []any{FieldMeta, appendMeta(nil, int64(i), m), FieldPayload, m.Payload}
		}},
	}
	dur := make([]time.Duration, len(layouts))
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for li, l := range layouts {
			t0 := time.Now()
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := 0; i < 1000; i++ {
					p.XAdd(ctx, &redis.XAddArgs{Stream: l.name + ":" + strconv.Itoa(i%16), Values: l.vals(n*1000 + i)})
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			dur[li] += time.Since(t0)
		}
	}
	b.StopTimer()
	entries := float64(b.N * 1000)
	for li, l := range layouts {
		var bytes int64
		for s := 0; s < 16; s++ {
			n, err := rdb.MemoryUsage(ctx, l.name+":"+strconv.Itoa(s), 0).Result()
			if err != nil {
				b.Fatal(err)
			}
			bytes += n
		}
		b.ReportMetric(entries/dur[li].Seconds(), l.name+"-entries/s")
		b.ReportMetric(float64(bytes)/entries, l.name+"-bytes/entry")
	}
	b.ReportMetric(dur[0].Seconds()/dur[1].Seconds(), "v2/v1")
}

// RawReadAll is the hand-written consumer the input benchmarks compare with: plain XREADGROUP of
// group g over queue q's shards in turn, each read asking for about batch messages (as the input
// does: a layout-3 entry holds several) and acked with one XACK, until total messages are read.
func RawReadAll(b *testing.B, rdb *redis.Client, l Layout, q string, shards, total, batch int) {
	ctx := context.Background()
	perEntry := 1 // messages per entry of the last read
	for got, n := 0, 0; got < total; n = (n + 1) % shards {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: ConsumerName(n),
			Streams: []string{l.Stream(q, n), ">"}, Count: int64(max(1, batch/perEntry)), Block: -1}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		if len(res[0].Messages) == 0 {
			continue
		}
		ids := make([]string, len(res[0].Messages))
		msgs := 0
		for i, m := range res[0].Messages {
			ids[i] = m.ID
			msgs += len(EntriesOf(nil, m))
		}
		rdb.XAck(ctx, l.Stream(q, n), "g", ids...)
		perEntry = max(1, msgs/len(ids))
		got += msgs
	}
}
