package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/queue"
	_ "github.com/pgrelay/pgrelay/output"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// produce builds a stream with the redis_queue output and returns its producer func.
func produce(t *testing.T, outputYAML string) (service.MessageBatchHandlerFunc, func()) {
	t.Helper()
	b := service.NewStreamBuilder()
	b.SetLoggerYAML("level: warn")
	send, err := b.AddBatchProducerFunc()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddOutputYAML(outputYAML); err != nil {
		t.Fatal(err)
	}
	stop := cdctest.RunStream(t, b)
	return send, func() { _ = stop() }
}

func batchOf(n, from int, meta map[string]string) service.MessageBatch {
	var b service.MessageBatch
	for i := from; i < from+n; i++ {
		m := service.NewMessage([]byte(fmt.Sprintf(`{"p":"p%d","n":%d}`, i%3, i)))
		m.MetaSetMut("p", fmt.Sprintf("p%d", i%3))
		m.MetaSetMut("id", fmt.Sprintf("m%d", i))
		m.MetaSetMut("x_trace", fmt.Sprintf("t%d", i))
		for k, v := range meta {
			m.MetaSetMut(k, v)
		}
		b = append(b, m)
	}
	return b
}

func TestQueuePluginsRoundTrip(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	send, stop := produce(t, fmt.Sprintf(`
redis_queue:
  url: %s
  queue: rt
  partition: ${! meta("p") }
  id: ${! meta("id") }
  shards: 4
  max_in_flight: 1
  metadata:
    include_prefixes: [ x_ ]
`, r.URL()))
	defer stop()
	for i := 0; i < 3; i++ {
		if err := send(ctx, batchOf(10, i*10, nil)); err != nil {
			t.Fatal(err)
		}
	}
	// a stale fence through the output: refused, coded, nothing written
	rdb := r.Client()
	l := lease.New(rdb, "pgrelay:{rt}:src:a:lease", 10*time.Second, "src")
	if ok, _ := l.TryAcquire(ctx); !ok {
		t.Fatal("lease")
	}
	err := send(ctx, batchOf(5, 100, map[string]string{"pgrelay_lease_key": "pgrelay:{rt}:src:a:lease",
		"pgrelay_fence": "old|1", "pgrelay_pointer_key": "pgrelay:{rt}:src:a:ptr", "pgrelay_cover": `{"pos":"01"}`}))
	if err == nil || !errcode.Is(err, errcode.Fenced) {
		t.Fatalf("stale fence through the output: %v", err)
	}
	// the right fence: written with the pointer; the same cover again: a duplicate, nothing written
	good := map[string]string{"pgrelay_lease_key": "pgrelay:{rt}:src:a:lease",
		"pgrelay_fence": l.Token(), "pgrelay_pointer_key": "pgrelay:{rt}:src:a:ptr", "pgrelay_cover": `{"pos":"01"}`}
	for i := 0; i < 2; i++ {
		if err := send(ctx, batchOf(5, 30, good)); err != nil {
			t.Fatal(err)
		}
	}
	if got := rdb.Get(ctx, "pgrelay:{rt}:src:a:ptr").Val(); got != `{"pos":"01"}` {
		t.Fatalf("pointer %q", got)
	}

	var mu sync.Mutex
	var got []*service.Message
	b := service.NewStreamBuilder()
	b.SetLoggerYAML("level: warn")
	if err := b.AddInputYAML(fmt.Sprintf(`
redis_queue:
  url: %s
  queue: rt
  group: g
  batch_count: 7
  block: 100ms
`, r.URL())); err != nil {
		t.Fatal(err)
	}
	stopConsumer := cdctest.RunConsumer(t, b, func(_ context.Context, batch service.MessageBatch) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, batch...)
		return nil
	})
	cdctest.Wait(t, 20*time.Second, "35 messages consumed", func() (bool, string) {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		return n >= 35, fmt.Sprintf("consumed %d of 35", n)
	})
	if err := stopConsumer(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 35 {
		t.Fatalf("consumed %d, want 35 (the fenced batch and the duplicate must not be in)", len(got))
	}
	last := map[string]int{}
	for _, m := range got {
		var body struct {
			P string
			N int
		}
		b, _ := m.AsBytes()
		_ = json.Unmarshal(b, &body)
		if prev, ok := last[body.P]; ok && body.N <= prev {
			t.Fatalf("partition %s: %d after %d", body.P, body.N, prev)
		}
		last[body.P] = body.N
		for k, want := range map[string]any{"queue": "rt", "partition": body.P, "message_id": fmt.Sprintf("m%d", body.N),
			"x_trace": fmt.Sprintf("t%d", body.N)} {
			if v, _ := m.MetaGetMut(k); v != want {
				t.Fatalf("meta %s = %v, want %v", k, v, want)
			}
		}
		for _, k := range []string{"shard", "offset", "created_at", "attempts"} {
			if v, _ := m.MetaGetMut(k); fmt.Sprintf("%T", v) != "int64" {
				t.Fatalf("meta %s = %v (%T), want an int64", k, v, v)
			}
		}
		shard, _ := m.MetaGetMut("shard")
		if int64(queue.Shard(body.P, 4)) != shard.(int64) {
			t.Fatalf("shard %v for %s", shard, body.P)
		}
		if tx, _ := m.MetaGet("transaction_id"); tx != "" {
			t.Fatalf("transaction_id %q", tx)
		}
	}
}

func TestQueueConfigsLint(t *testing.T) {
	linter := service.GlobalEnvironment().NewComponentConfigLinter()
	cases := []struct {
		name, yaml, want string
		input            bool
	}{
		{"output ok", "redis_queue:\n  queue: q\n  durability: aof\n", "", false},
		{"output replicas", "redis_queue:\n  queue: q\n  durability:\n    replicas: 1\n    timeout: 2s\n", "", false},
		{"output bad durability", "redis_queue:\n  queue: q\n  durability: fsync\n", "durability must be", false},
		{"output bad shards", "redis_queue:\n  queue: q\n  shards: 0\n", "shards must be", false},
		{"input ok", "redis_queue:\n  queue: q\n  group: g\n", "", true},
		{"input bad group", "redis_queue:\n  queue: q\n  group: 'a:b'\n", "group must be", true},
		{"input bad start", "redis_queue:\n  queue: q\n  group: g\n  start_from: middle\n", "valid option", true},
	}
	for _, c := range cases {
		lint := linter.LintOutputYAML
		if c.input {
			lint = linter.LintInputYAML
		}
		lints, err := lint([]byte(c.yaml))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var all []string
		for _, l := range lints {
			all = append(all, l.What)
		}
		text := strings.Join(all, "; ")
		if (c.want == "") != (len(lints) == 0) || (c.want != "" && !strings.Contains(text, c.want)) {
			t.Errorf("%s: lints %q, want %q", c.name, text, c.want)
		}
	}
}

// TestQueueOutputRetention: the output's retention trims a shard to max_length only below what the
// queue's group has acked, in layout 2 (an entry per message) and 3 (here an entry per batch of 10:
// the entries holding the newest 5 messages and the last delivered one are kept).
func TestQueueOutputRetention(t *testing.T) {
	for _, c := range []struct {
		version, entries, kept int
		oldest                 string
	}{{queue.LayoutV2, 40, 11, "m29"}, {queue.LayoutV3, 4, 2, "m20"}} {
		t.Run(fmt.Sprintf("v%d", c.version), func(t *testing.T) { outputRetention(t, c.version, c.entries, c.kept, c.oldest) })
	}
}

func outputRetention(t *testing.T, version, entries, kept int, oldest string) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	stream := queue.NewLayout("").Stream("ret", 0)
	rdb.XGroupCreateMkStream(ctx, stream, "slow", "0")
	send, stop := produce(t, fmt.Sprintf(`
redis_queue:
  url: %s
  queue: ret
  partition: ${! meta("p") }
  id: ${! meta("id") }
  shards: 1
  max_length: 5
  trim_interval: 100ms
  layout_version: %d
`, r.URL(), version))
	defer stop()
	for i := 0; i < 40; i += 10 {
		if err := send(ctx, batchOf(10, i, nil)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := rdb.XLen(ctx, stream).Val(); n != int64(entries) {
		t.Fatalf("trimmed to %d while the group had acked nothing", n)
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "slow", Consumer: "c", Streams: []string{stream, ">"}, Count: int64(entries * 3 / 4), Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range res[0].Messages {
		rdb.XAck(ctx, stream, "slow", x.ID)
	}
	cdctest.Wait(t, 5*time.Second, "the stream trimmed", func() (bool, string) {
		n := rdb.XLen(ctx, stream).Val() // messages 30..39 unread, plus the last delivered entry kept
		return n == int64(kept), fmt.Sprintf("length %d, want %d", n, kept)
	})
	first := rdb.XRangeN(ctx, stream, "-", "+", 1).Val()[0]
	if id := queue.EntriesOf(nil, first)[0].MessageID; id != oldest {
		t.Fatalf("oldest kept %v", id)
	}
}
