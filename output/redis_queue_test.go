package output

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
)

func TestQueueOutputParse(t *testing.T) {
	cases := []struct {
		name, yaml string
		check      func(RedisQueueConfig) bool
		wantErr    bool
	}{
		{"defaults", "queue: q\n", func(c RedisQueueConfig) bool {
			d := c.writer.Durability
			return !d.AOF && d.Replicas == 0 && c.writer.Shards == 0 && !c.writer.StrictShards &&
				c.writer.Prefix == "pgrelay" && !c.retention.Enabled() && (c.metadata == nil || c.metadata.IsEmpty())
		}, false},
		{"aof, explicit shards", "queue: q\ndurability: aof\nshards: 8\n", func(c RedisQueueConfig) bool {
			return c.writer.Durability.AOF && c.writer.Shards == 8 && c.writer.StrictShards
		}, false},
		{"replicas", "queue: q\ndurability:\n  replicas: 2\n  timeout: 250ms\n", func(c RedisQueueConfig) bool {
			d := c.writer.Durability
			return d.Replicas == 2 && d.WaitTimeout == 250*time.Millisecond
		}, false},
		{"retention and header", "queue: q\nmax_age: 1h\nmax_length: 10\nmetadata:\n  include_prefixes: [x_]\n", func(c RedisQueueConfig) bool {
			return c.retention.MaxAge == time.Hour && c.retention.MaxLength == 10 && c.metadata != nil && c.metadata.Match("x_a") && !c.metadata.Match("y")
		}, false},
		{"layout version default", "queue: q\n", func(c RedisQueueConfig) bool {
			return c.writer.CreateVersion == queue.LayoutVersion
		}, false},
		{"layout version 2", "queue: q\nlayout_version: 2\n", func(c RedisQueueConfig) bool {
			return c.writer.CreateVersion == queue.LayoutV2
		}, false},
		{"layout version 1", "queue: q\nlayout_version: 1\n", func(c RedisQueueConfig) bool {
			return c.writer.CreateVersion == queue.LayoutV1
		}, false},
		{"layout version 4", "queue: q\nlayout_version: 4\n", nil, true},
		{"replicas zero", "queue: q\ndurability:\n  replicas: 0\n", nil, true},
		{"unknown durability", "queue: q\ndurability: fsync\n", nil, true},
	}
	spec := RedisQueueSpec()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pc, err := spec.ParseYAML(c.yaml, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := RedisQueueConfigFromParsed(pc)
			if c.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil || !c.check(got) {
				t.Fatalf("%+v %v", got, err)
			}
		})
	}
}

// TestQueueOutputMessages checks the conversion of a batch: the default fields read metadata
// directly, other interpolations still run, the cover is read once, and messages carrying another
// cover are refused.
func TestQueueOutputMessages(t *testing.T) {
	msg := func(part, cover string) *service.Message {
		m := service.NewMessage([]byte(`{"n":1}`))
		m.MetaSetMut("queue", "q1")
		m.MetaSetMut("partition", part)
		m.MetaSetMut("message_id", "id-"+part)
		m.MetaSetMut("transaction_id", "tx")
		m.MetaSetMut("pgrelay_lease_key", "lk")
		m.MetaSetMut("pgrelay_fence", "f")
		m.MetaSetMut("pgrelay_pointer_key", "pk")
		m.MetaSetMut("pgrelay_cover", cover)
		return m
	}
	cover := `{"v":1,"pos":"00000001/00000000000000c8"}`
	for _, c := range []struct {
		yaml, wantQueue, wantPart string
	}{
		{"{}", "q1", "7"},
		{`queue: ${! meta("queue") }-x` + "\npartition: ${! json(\"n\") }\n", "q1-x", "1"},
		{"queue: fixed\n", "fixed", "7"},
	} {
		o := parsedOutput(t, c.yaml)
		msgs, cv, _, err := o.toMessages(service.MessageBatch{msg("7", cover), msg("7", cover)}, new([]queue.Message))
		if err != nil {
			t.Fatal(err)
		}
		if msgs[1].Queue != c.wantQueue || msgs[1].Partition != c.wantPart || msgs[1].ID != "id-7" || msgs[1].Tx != "tx" {
			t.Fatalf("%s: %+v", c.yaml, msgs[1])
		}
		if cv == nil || cv.Pos != "00000001/00000000000000c8" || cv.LeaseKey != "lk" || cv.Fence != "f" || cv.PointerKey != "pk" || string(cv.Pointer) != cover {
			t.Fatalf("%s: cover %+v", c.yaml, cv)
		}
		if _, _, _, err := o.toMessages(service.MessageBatch{msg("7", cover), msg("8", `{"pos":"x"}`)}, new([]queue.Message)); err == nil {
			t.Fatalf("%s: two covers in one batch accepted", c.yaml)
		}
	}
}

// TestQueueOutputSourceBatch checks the cover a source hands over in the messages' context: taken
// from there (before any metadata), marked on success, and refused when the messages of one batch
// carry different source batches or only some carry one.
func TestQueueOutputSourceBatch(t *testing.T) {
	sb := func(pos string) *queue.SourceBatch {
		return &queue.SourceBatch{Cover: queue.Cover{LeaseKey: "lk", Fence: "f", PointerKey: "pk", Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos},
			Receipt: queue.NewCoverReceipt(pos)}
	}
	msg := func(b *queue.SourceBatch) *service.Message {
		m := service.NewMessage([]byte(`{"n":1}`))
		m.MetaSetMut("queue", "q1")
		m.MetaSetMut("partition", "7")
		m.MetaSetMut("message_id", "id")
		m.MetaSetMut("pgrelay_cover", `{"pos":"metadata"}`)
		if b != nil {
			m = m.WithContext(queue.WithSourceBatch(context.Background(), b))
		}
		return m
	}
	o := parsedOutput(t, "{}")
	a, b := sb("01"), sb("02")
	_, cv, got, err := o.toMessages(service.MessageBatch{msg(a), msg(a)}, new([]queue.Message))
	if err != nil || got != a || cv != &a.Cover {
		t.Fatalf("source batch: %v, cover %+v, %v", got, cv, err)
	}
	for name, batch := range map[string]service.MessageBatch{
		"two source batches": {msg(a), msg(b)},
		"first without":      {msg(nil), msg(a)},
		"second without":     {msg(a), msg(nil)},
	} {
		if _, _, _, err := o.toMessages(batch, new([]queue.Message)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// fixedKeys is a source batch's keys for messages without metadata (pg_cdc's metadata: false).
type fixedKeys [][4]string

func (k fixedKeys) Len() int { return len(k) }
func (k fixedKeys) Keys(i int) (q, p, id, tx string) {
	return k[i][0], k[i][1], k[i][2], k[i][3]
}

// TestQueueOutputKeysWithoutMetadata: messages of a source batch that carries its keys (pg_cdc's
// metadata: false) take queue, partition, id and transaction from it by their place, unless the
// message has that metadata itself (a processor set it); a field that is not a metadata key is
// evaluated as usual; a batch of another size than the source made is refused with
// batch_reshaped.
func TestQueueOutputKeysWithoutMetadata(t *testing.T) {
	keys := fixedKeys{{"q1", "p1", "id1", "tx1"}, {"q2", "p2", "id2", "tx1"}, {"q1", "p3", "id3", "tx2"}}
	sb := &queue.SourceBatch{Cover: queue.Cover{LeaseKey: "lk", Fence: "f", PointerKey: "pk", Pointer: []byte(`{"pos":"01"}`), Pos: "01"},
		Receipt: queue.NewCoverReceipt("01"), Keys: keys}
	tmpl := service.NewMessage(nil).WithContext(queue.WithSourceBatch(context.Background(), sb))
	batch := func(n int) service.MessageBatch {
		out := make(service.MessageBatch, n)
		for i := range out {
			out[i] = tmpl.Copy()
			out[i].SetBytes([]byte(fmt.Sprintf(`{"n":%d,"customer":"c%d"}`, i, i)))
		}
		return out
	}
	for _, tc := range []struct {
		name, yaml string
		edit       func(service.MessageBatch)
		want       [][4]string // queue, partition, id, tx of each message
		code       errcode.Code
	}{
		{name: "keys by place", yaml: "{}", want: keys},
		{name: "metadata set by a processor wins", yaml: "{}",
			edit: func(b service.MessageBatch) {
				b[1].MetaSetMut("partition", "moved")
				b[2].MetaSetMut("transaction_id", "mine")
			},
			want: [][4]string{{"q1", "p1", "id1", "tx1"}, {"q2", "moved", "id2", "tx1"}, {"q1", "p3", "id3", "mine"}}},
		{name: "an interpolated partition", yaml: `partition: ${! json("customer") }`,
			want: [][4]string{{"q1", "c0", "id1", "tx1"}, {"q2", "c1", "id2", "tx1"}, {"q1", "c2", "id3", "tx2"}}},
		{name: "a static queue", yaml: "queue: fixed",
			want: [][4]string{{"fixed", "p1", "id1", "tx1"}, {"fixed", "p2", "id2", "tx1"}, {"fixed", "p3", "id3", "tx2"}}},
		{name: "a message dropped", yaml: "{}", edit: func(service.MessageBatch) {}, code: errcode.BatchReshaped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parsedOutput(t, tc.yaml)
			b := batch(len(keys))
			if tc.code != "" {
				b = b[:2]
			}
			if tc.edit != nil {
				tc.edit(b)
			}
			msgs, cv, got, err := o.toMessages(b, new([]queue.Message))
			if tc.code != "" {
				if !errcode.Is(err, tc.code) {
					t.Fatalf("error %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil || got != sb || cv != &sb.Cover {
				t.Fatalf("source batch %v, cover %v: %v", got, cv, err)
			}
			for i, m := range msgs {
				if g := [4]string{m.Queue, m.Partition, m.ID, m.Tx}; g != tc.want[i] {
					t.Errorf("message %d: %q, want %q", i, g, tc.want[i])
				}
				if want := fmt.Sprintf(`{"n":%d,"customer":"c%d"}`, i, i); string(m.Payload) != want {
					t.Errorf("message %d payload %s", i, m.Payload)
				}
			}
		})
	}
}

// parsedOutput is an output (not connected) with the config yaml.
func parsedOutput(t *testing.T, yaml string) *queueOutput {
	t.Helper()
	return &queueOutput{conf: parsedConfig(t, yaml)}
}

// parsedConfig is the output config of yaml (parsed, not linted).
func parsedConfig(t *testing.T, yaml string) RedisQueueConfig {
	t.Helper()
	pc, err := RedisQueueSpec().ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := RedisQueueConfigFromParsed(pc)
	if err != nil {
		t.Fatal(err)
	}
	return conf
}
