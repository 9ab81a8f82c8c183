package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestShard(t *testing.T) {
	cases := []struct {
		partition string
		shards    int
		want      int
	}{
		{"", 16, 0}, // crc32("") = 0
		{"a", 16, 0xe8b7be43 % 16},
		{"42", 16, 0x3224b088 % 16},
		{"anything", 1, 0},
		{"a", 7, 0xe8b7be43 % 7},
	}
	for _, c := range cases {
		if got := Shard(c.partition, c.shards); got != c.want {
			t.Errorf("Shard(%q, %d) = %d, want %d", c.partition, c.shards, got, c.want)
		}
	}
}

func TestLayoutKeys(t *testing.T) {
	l := NewLayout("")
	for got, want := range map[string]string{
		l.Meta("orders"):                  "pgrelay:{orders}:meta",
		l.Stream("orders", 3):             "pgrelay:{orders}:s:3",
		l.GroupLease("orders", "sink", 2): "pgrelay:{orders}:g:sink:lease:2",
		l.Attempts("orders", "sink"):      "pgrelay:{orders}:g:sink:attempts",
		l.DLQ("orders"):                   "pgrelay:{orders}:dlq",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
}

// msgs makes n messages on queue q spread over partitions p0..p(parts-1).
func msgs(q string, n, parts int) []Message {
	out := make([]Message, n)
	for i := range out {
		out[i] = Message{Queue: q, Partition: fmt.Sprintf("p%d", i%parts), ID: fmt.Sprintf("m%d", i),
			Tx: "tx1", CreatedMs: 1700000000000 + int64(i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

// readAll reads every message of queue q, shard by shard (a layout-3 entry gives several).
func readAll(t *testing.T, rdb redis.Cmdable, l Layout, q string, shards int) map[int][]Entry {
	t.Helper()
	out := map[int][]Entry{}
	for n := 0; n < shards; n++ {
		xs, err := rdb.XRange(context.Background(), l.Stream(q, n), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range xs {
			out[n] = EntriesOf(out[n], x)
		}
	}
	return out
}

// writeBatches writes n batches of size messages of one partition into q, ids "b<batch>-<i>":
// in layout 3, an entry per batch.
func writeBatches(t *testing.T, w *Writer, q string, n, size int) {
	t.Helper()
	for i := range n {
		batch := msgs(q, size, 1)
		for j := range batch {
			batch[j].ID = fmt.Sprintf("b%d-%d", i, j)
		}
		if _, err := w.Write(context.Background(), batch, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func count(m map[int][]Entry) int {
	c := 0
	for _, es := range m {
		c += len(es)
	}
	return c
}

// TestWriteLayout writes new queues (layout versions 3 and 2) and one created in version 1, through
// the transaction and through the script, and reads every message back: offsets, shards, and the
// exact fields on the wire of each version (DESIGN §4).
func TestWriteLayout(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	firstV1 := func(f []any) bool {
		return f[1] == "1" && f[3] == "p0" && f[5] == "m0" && f[7] == "tx1" && f[9] == "1700000000000" &&
			f[11] == `{"k":"v"}` && f[13] == `{"i":0}`
	}
	for _, c := range []struct {
		version int
		created bool // created by a writer of CreateVersion version, not by an earlier pgrelay
		fields  string
		first   func(f []any) bool // the first entry of p0's shard (message m0, with a header)
	}{
		{LayoutV3, true, "[m d]", func(f []any) bool { // every message of the shard in one entry
			m, d := f[1].(string), f[3].(string)
			return strings.HasPrefix(m, `[{"off":1,"len":7,"p":"p0","id":"m0","tx":"tx1","ts":1700000000000,"h":{"k":"v"}},{"off":2,"len":7,`) &&
				strings.HasSuffix(m, `}]`) && strings.HasPrefix(d, `{"i":0}{"i":`) && strings.Count(m, `"off"`) == strings.Count(d, `{"i"`)
		}},
		{LayoutV2, true, "[m d]", func(f []any) bool {
			return f[1] == `{"off":1,"p":"p0","id":"m0","tx":"tx1","ts":1700000000000,"h":{"k":"v"}}` && f[3] == `{"i":0}`
		}},
		{LayoutV1, false, "[off p id tx ts h d]", firstV1},
		{LayoutV1, true, "[off p id tx ts h d]", firstV1},
	} {
		for _, script := range []bool{false, true} {
			t.Run(fmt.Sprintf("v%d/created=%v/script=%v", c.version, c.created, script), func(t *testing.T) {
				q := fmt.Sprintf("orders%d%v%v", c.version, c.created, script)
				conf := WriterConfig{Shards: 4}
				if c.created {
					conf.CreateVersion = c.version
				} else { // a queue an earlier pgrelay created; this writer would create version 2
					rdb.HSet(ctx, "pgrelay:{"+q+"}:meta", "shards", "4", "version", "1")
				}
				w := NewWriter(rdb, conf)
				defer w.Close()
				w.scriptOnly = script
				batch := msgs(q, 20, 5)
				batch[0].Header = []byte(`{"k":"v"}`)
				if res, err := w.Write(ctx, batch, nil); err != nil || res != ResultOK {
					t.Fatalf("write: %v %v", res, err)
				}
				if _, err := w.Write(ctx, msgs(q, 20, 5), nil); err != nil {
					t.Fatal(err)
				}
				meta := rdb.HGetAll(ctx, "pgrelay:{"+q+"}:meta").Val()
				if meta["shards"] != "4" || meta["version"] != strconv.Itoa(c.version) {
					t.Fatalf("meta %v", meta)
				}
				got := readAll(t, rdb, w.Layout(), q, 4)
				if count(got) != 40 {
					t.Fatalf("%d messages, want 40", count(got))
				}
				for n, es := range got {
					if meta["off:"+strconv.Itoa(n)] != strconv.Itoa(len(es)) {
						t.Errorf("shard %d: meta off %q, %d messages", n, meta["off:"+strconv.Itoa(n)], len(es))
					}
					for i, e := range es {
						if e.Offset != int64(i+1) || e.Tx != "tx1" || e.CreatedMs < 1700000000000 || len(e.Payload) == 0 {
							t.Errorf("shard %d entry %d: %+v", n, i, e)
						}
						if Shard(e.Partition, 4) != n {
							t.Errorf("partition %v in shard %d", e.Partition, n)
						}
					}
				}
				// the fields on the wire, in order
				raw, err := rdb.Do(ctx, "XRANGE", w.Layout().Stream(q, Shard("p0", 4)), "-", "+", "COUNT", 1).Slice()
				if err != nil {
					t.Fatal(err)
				}
				fields := raw[0].([]any)[1].([]any)
				var names []string
				for i := 0; i < len(fields); i += 2 {
					names = append(names, fields[i].(string))
				}
				if fmt.Sprint(names) != c.fields {
					t.Errorf("fields %v, want %s", names, c.fields)
				}
				if !c.first(fields) {
					t.Errorf("entry %q", fields)
				}
			})
		}
	}
}

// entryOf is the first message of stream entry x (its only one in layouts 1 and 2).
func entryOf(x redis.XMessage) Entry { return EntriesOf(nil, x)[0] }

// TestEntriesOf decodes entries of every layout, and the m objects a foreign producer may write:
// escapes, members in another order, a header, and what does not parse (fields stay zero); a
// layout-3 entry gives each message with its payload cut from d by its len, and one whose lengths
// do not add up to d is one message holding d with its fields zero.
func TestEntriesOf(t *testing.T) {
	one := func(e Entry) []Entry { e.Count = 1; return []Entry{e} }
	packed := func(es ...Entry) []Entry {
		for i := range es {
			es[i].Index, es[i].Count, es[i].packed = i, len(es), true
		}
		return es
	}
	for _, c := range []struct {
		name   string
		values map[string]any
		want   []Entry
	}{
		{"v1", map[string]any{"off": "7", "p": "a|b", "id": "m1", "tx": "t", "ts": "12", "h": `{"k":1}`, "d": "x"},
			one(Entry{Offset: 7, Partition: "a|b", MessageID: "m1", Tx: "t", CreatedMs: 12, Header: []byte(`{"k":1}`), Payload: []byte("x")})},
		{"v2", map[string]any{"m": `{"off":7,"p":"a\"b\u00e9","id":"m1","tx":"t","ts":12,"h":{"k":[1,2]}}`, "d": "x"},
			one(Entry{Offset: 7, Partition: "a\"bé", MessageID: "m1", Tx: "t", CreatedMs: 12, Header: []byte(`{"k":[1,2]}`), Payload: []byte("x")})},
		{"v2 other order, no header", map[string]any{"m": `{ "ts": 12, "id": "m1", "off": 7 }`, "d": ""},
			one(Entry{Offset: 7, MessageID: "m1", CreatedMs: 12, Payload: []byte{}})},
		{"v2 not JSON", map[string]any{"m": `off=7`, "d": "x"}, one(Entry{Payload: []byte("x")})},
		{"v2 cut short", map[string]any{"m": `{"off":7,"p":"a",`, "d": "x"}, one(Entry{Payload: []byte("x")})},
		{"v2 wrong types", map[string]any{"m": `{"off":"7","p":5,"id":"m1","h":"x"}`, "d": "x"}, one(Entry{MessageID: "m1", Payload: []byte("x")})},
		{"v3", map[string]any{"m": `[{"off":7,"len":3,"p":"a","id":"m1","tx":"t","ts":12,"h":{"k":1}},{"off":8,"len":0,"p":"b","id":"m2","tx":"t","ts":12},{"off":9,"len":2,"p":"a","id":"m3","tx":"u","ts":13}]`, "d": "xyzé"},
			packed(Entry{Offset: 7, Partition: "a", MessageID: "m1", Tx: "t", CreatedMs: 12, Header: []byte(`{"k":1}`), Payload: []byte("xyz")},
				Entry{Offset: 8, Partition: "b", MessageID: "m2", Tx: "t", CreatedMs: 12, Payload: []byte{}},
				Entry{Offset: 9, Partition: "a", MessageID: "m3", Tx: "u", CreatedMs: 13, Payload: []byte("é")})},
		{"v3 one message, members in another order", map[string]any{"m": ` [ { "len" : 1, "off": 4 } ] `, "d": "x"},
			packed(Entry{Offset: 4, Payload: []byte("x")})},
		{"v3 lengths short of d", map[string]any{"m": `[{"off":7,"len":1},{"off":8,"len":1}]`, "d": "xyz"}, one(Entry{Payload: []byte("xyz")})},
		{"v3 lengths past d", map[string]any{"m": `[{"off":7,"len":2},{"off":8,"len":2}]`, "d": "xyz"}, one(Entry{Payload: []byte("xyz")})},
		{"v3 without len", map[string]any{"m": `[{"off":7}]`, "d": "x"}, one(Entry{Payload: []byte("x")})},
		{"v3 empty", map[string]any{"m": `[]`, "d": ""}, one(Entry{Payload: []byte{}})},
		{"v3 not JSON", map[string]any{"m": `[{"off":7,"len":1}`, "d": "x"}, one(Entry{Payload: []byte("x")})},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.want {
				c.want[i].ID = "1-1"
			}
			got := EntriesOf(nil, redis.XMessage{ID: "1-1", Values: c.values})
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestAppendMetaTail: the m object is valid JSON with the message's exact strings, escaped.
func TestAppendMeta(t *testing.T) {
	m := Message{Partition: "public.t:{\"id\":\"a\\b\"}", ID: "pg:1:0/1:2", Tx: "", CreatedMs: 5, Header: []byte(`{"x":"y"}`)}
	b := appendMeta(nil, 42, &m)
	var got struct {
		Off int64           `json:"off"`
		P   string          `json:"p"`
		ID  string          `json:"id"`
		Tx  *string         `json:"tx"`
		Ts  int64           `json:"ts"`
		H   json.RawMessage `json:"h"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if got.Off != 42 || got.P != m.Partition || got.ID != m.ID || got.Tx == nil || *got.Tx != "" || got.Ts != 5 || string(got.H) != `{"x":"y"}` {
		t.Errorf("%s", b)
	}
	e := entryOf(redis.XMessage{Values: map[string]any{"m": string(b)}})
	if e.Partition != m.Partition || e.Offset != 42 || string(e.Header) != `{"x":"y"}` {
		t.Errorf("round trip %+v", e)
	}
}

func TestWriteFenceAndCover(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := NewWriter(rdb, WriterConfig{Shards: 2})
	leaseKey, ptrKey := "pgrelay:{q}:src:s1:lease", "pgrelay:{q}:src:s1:ptr"
	l := lease.New(rdb, leaseKey, 10*time.Second, "me")
	if ok, err := l.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("acquire %v %v", ok, err)
	}
	cover := func(pos string) *Cover {
		return &Cover{LeaseKey: leaseKey, Fence: l.Token(), PointerKey: ptrKey,
			Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}
	}
	type step struct {
		name    string
		cover   *Cover
		n       int
		want    Result
		code    errcode.Code
		total   int    // entries in the queue afterwards
		pointer string // pos stored afterwards
	}
	stale := cover("0002")
	stale.Fence = "someone|0"
	steps := []step{
		{"first", cover("0001"), 3, ResultOK, "", 3, "0001"},
		{"repeat", cover("0001"), 3, ResultDuplicate, "", 3, "0001"},
		{"behind", cover("0000"), 3, ResultDuplicate, "", 3, "0001"},
		{"stale fence", stale, 3, ResultOK, errcode.Fenced, 3, "0001"},
		{"pointer only", cover("0002"), 0, ResultOK, "", 3, "0002"},
		{"pointer only again", cover("0002"), 0, ResultDuplicate, "", 3, "0002"},
		{"next", cover("0003"), 4, ResultOK, "", 7, "0003"},
		{"fenced plain", &Cover{LeaseKey: leaseKey, Fence: "x|1"}, 2, ResultOK, errcode.Fenced, 7, "0003"},
		{"unfenced plain", nil, 2, ResultOK, "", 9, "0003"},
	}
	for _, s := range steps {
		res, err := w.Write(ctx, msgs("q", s.n, 3), s.cover)
		if s.code != "" {
			if !errcode.Is(err, s.code) {
				t.Fatalf("%s: err %v, want code %s", s.name, err, s.code)
			}
		} else if err != nil || res != s.want {
			t.Fatalf("%s: %v %v, want %v", s.name, res, err, s.want)
		}
		if got := count(readAll(t, rdb, w.Layout(), "q", 2)); got != s.total {
			t.Fatalf("%s: %d entries, want %d", s.name, got, s.total)
		}
		if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"`+s.pointer+`"}` {
			t.Fatalf("%s: pointer %s", s.name, got)
		}
	}
	// a stale fence on an empty queue creates nothing, not even meta
	_, err := w.Write(ctx, msgs("fresh", 2, 2), &Cover{LeaseKey: leaseKey, Fence: "x|1"})
	if !errcode.Is(err, errcode.Fenced) || rdb.Exists(ctx, w.Layout().Meta("fresh")).Val() != 0 {
		t.Fatalf("fenced write on a new queue: %v, meta exists %d", err, rdb.Exists(ctx, w.Layout().Meta("fresh")).Val())
	}
	// a corrupt pointer is a coded error and writes nothing
	rdb.Set(ctx, ptrKey, "not json", 0)
	if _, err := w.Write(ctx, msgs("q", 2, 2), cover("0009")); !errcode.Is(err, errcode.PointerCorrupt) {
		t.Fatalf("corrupt pointer: %v", err)
	}
	if got := count(readAll(t, rdb, w.Layout(), "q", 2)); got != 9 {
		t.Fatalf("corrupt pointer wrote: %d entries", got)
	}
}

func TestWriteSplit(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		conf      WriterConfig
		n, pieces int
	}{
		{"by count", WriterConfig{Shards: 3, MaxScriptMessages: 3}, 10, 4},
		{"by bytes", WriterConfig{Shards: 3, MaxScriptBytes: 100}, 10, 5},
		{"one piece", WriterConfig{Shards: 3}, 10, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := NewWriter(rdb, c.conf)
			if got := len(w.split(msgs(c.name, c.n, 4))); got != c.pieces {
				t.Errorf("%d pieces, want %d", got, c.pieces)
			}
			cov := &Cover{PointerKey: "pgrelay:{" + c.name + "}:src:x:ptr", Pointer: []byte(`{"pos":"1"}`), Pos: "1"}
			if res, err := w.Write(ctx, msgs(c.name, c.n, 4), cov); err != nil || res != ResultOK {
				t.Fatalf("%v %v", res, err)
			}
			if got := count(readAll(t, rdb, w.Layout(), c.name, 3)); got != c.n {
				t.Errorf("%d entries, want %d", got, c.n)
			}
			if res, _ := w.Write(ctx, msgs(c.name, c.n, 4), cov); res != ResultDuplicate {
				t.Errorf("repeat: %v", res)
			}
			if got := count(readAll(t, rdb, w.Layout(), c.name, 3)); got != c.n {
				t.Errorf("after repeat: %d entries, want %d", got, c.n)
			}
		})
	}
}

func TestWriteShardCount(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	if _, err := NewWriter(rdb, WriterConfig{Shards: 4}).Write(ctx, msgs("q", 8, 8), nil); err != nil {
		t.Fatal(err)
	}
	// existing count wins for a lenient writer
	w := NewWriter(rdb, WriterConfig{Shards: 8})
	if _, err := w.Write(ctx, msgs("q", 8, 8), nil); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rdb, w.Layout(), "q", 8); len(got) > 4 || count(got) != 16 {
		t.Errorf("shards used %d, entries %d", len(got), count(got))
	}
	// a strict writer refuses
	_, err := NewWriter(rdb, WriterConfig{Shards: 8, StrictShards: true}).Write(ctx, msgs("q", 1, 1), nil)
	if !errcode.Is(err, errcode.ShardsMismatch) {
		t.Fatalf("strict: %v", err)
	}
	// a writer whose cache went stale (queue recreated) re-reads the count
	if _, err := w.Write(ctx, msgs("q", 1, 1), nil); err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, w.Layout().Meta("q"), "shards", "2")
	if _, err := w.Write(ctx, msgs("q", 1, 1), nil); err != nil {
		t.Fatalf("after recreate: %v", err)
	}
	// a layout this version does not write: the script's error reply becomes a coded error
	rdb.HSet(ctx, w.Layout().Meta("q"), "version", "4")
	if _, err := w.Write(ctx, msgs("q", 1, 1), nil); !errcode.Is(err, errcode.LayoutVersion) {
		t.Fatalf("layout version 4: %v", err)
	}
}

// TestClassify proves Redis error replies are matched by their prefix, including the CROSSSLOT
// error go-redis returns itself, and that other errors naming a prefix in their text are not.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want errcode.Code
	}{
		{"go-redis cross slot", redis.ErrCrossSlot, errcode.CrossSlot},
		{"wrapped cross slot", fmt.Errorf("write: %w", redis.ErrCrossSlot), errcode.CrossSlot},
		{"not a redis error", errors.New("CROSSSLOT Keys in request don't hash to the same slot"), ""},
		{"prefix elsewhere in a redis error", redis.ErrNoScript, ""},
		{"plain error naming a script error", errors.New("dial: pgrelay_shards_mismatch"), ""},
	} {
		if got := errcode.Of(classify(c.err)); got != c.want {
			t.Errorf("%s: code %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWriteSeveralQueues(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := NewWriter(rdb, WriterConfig{Shards: 2})
	// a, then b, then a again: each queue's shards get contiguous offsets
	late := batchOf("a", "late", 3, 3)
	batch := append(append(msgs("a", 3, 2), msgs("b", 4, 2)...), late...)
	cov := &Cover{PointerKey: "pgrelay:{a}:src:x:ptr", Pointer: []byte(`{"pos":"1"}`), Pos: "1"}
	if _, err := w.Write(ctx, batch, cov); err != nil {
		t.Fatal(err)
	}
	checkQueue(t, rdb, w.Layout(), "a", msgs("a", 3, 2), late)
	checkQueue(t, rdb, w.Layout(), "b", msgs("b", 4, 2))
	if _, err := w.Write(ctx, []Message{{Queue: "bad{x}"}}, nil); !errcode.Is(err, errcode.BadQueue) {
		t.Fatalf("bad queue: %v", err)
	}
}

func TestCheckAOF(t *testing.T) {
	ctx := context.Background()
	good := testenv.StartRedis(t)
	if err := NewWriter(good.Client(), WriterConfig{Durability: Durability{AOF: true}}).Connect(ctx); err != nil {
		t.Fatalf("appendfsync always: %v", err)
	}
	bad := testenv.StartRedis(t, "--appendfsync", "everysec")
	err := NewWriter(bad.Client(), WriterConfig{Durability: Durability{AOF: true}}).Connect(ctx)
	if !errcode.Is(err, errcode.DurabilityAOF) {
		t.Fatalf("appendfsync everysec: %v", err)
	}
}

func TestWriteReplicas(t *testing.T) {
	ctx := context.Background()
	primary := testenv.StartRedis(t)
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	pc := primary.Client()
	// online, not only connected: a replica still in its first sync acknowledges nothing
	cdctest.WaitEvery(t, 20*time.Second, 100*time.Millisecond, "the replica to come online", func() (bool, string) {
		info := pc.Info(ctx, "replication").Val()
		return strings.Contains(info, "state=online"), info
	})
	w := NewWriter(primary.Client(), WriterConfig{Shards: 2, Durability: Durability{Replicas: 1, WaitTimeout: 5 * time.Second}})
	cov := &Cover{PointerKey: "pgrelay:{q}:src:x:ptr", Pointer: []byte(`{"pos":"1"}`), Pos: "1"}
	if _, err := w.Write(ctx, msgs("q", 5, 2), cov); err != nil {
		t.Fatal(err)
	}
	if got := count(readAll(t, replica.Client(), w.Layout(), "q", 2)); got != 5 {
		t.Fatalf("replica has %d entries right after the write", got)
	}
	if res, err := w.Write(ctx, msgs("q", 5, 2), cov); err != nil || res != ResultDuplicate {
		t.Fatalf("duplicate with WAIT: %v %v", res, err)
	}
	w2 := NewWriter(primary.Client(), WriterConfig{Shards: 2, RetryFor: -1, Durability: Durability{Replicas: 2, WaitTimeout: 200 * time.Millisecond}})
	if _, err := w2.Write(ctx, msgs("q", 1, 1), nil); !errcode.Is(err, errcode.ReplicasShortfall) {
		t.Fatalf("shortfall: %v", err)
	}
}

// TestCoverReceipt checks that a receipt is marked only for its own position, and that nil and
// unmarked receipts say "unknown" (read the pointer).
func TestCoverReceipt(t *testing.T) {
	var none *CoverReceipt
	none.Mark("p")
	if none.Done() {
		t.Fatal("a nil receipt is done")
	}
	r := NewCoverReceipt("00000001/00000000000000c8")
	for _, pos := range []string{"", "00000001/00000000000000c7", "00000001/00000000000000c9"} {
		r.Mark(pos)
		if r.Done() {
			t.Fatalf("marked by another position %q", pos)
		}
	}
	r.Mark("00000001/00000000000000c8")
	if !r.Done() || r.String() != "00000001/00000000000000c8" {
		t.Fatalf("not marked by its own position: %v %s", r.Done(), r)
	}
	if b, err := r.MarshalJSON(); err != nil || string(b) != `"00000001/00000000000000c8"` {
		t.Fatalf("json %s %v", b, err)
	}
}

// TestTruncatedLoadWarning: the start warning names every master (of a cluster too, asked at
// once) that loads a cut append-only file by truncating it, and nothing once none does.
func TestTruncatedLoadWarning(t *testing.T) {
	ctx := context.Background()
	single := testenv.StartRedis(t)
	cluster := testenv.StartRedisCluster(t)
	cc := cluster.Client(t)
	for _, c := range []struct {
		name  string
		rdb   redis.UniversalClient
		nodes []*testenv.Redis
	}{
		{"one server", single.Client(), []*testenv.Redis{single}},
		{"cluster", cc, cluster.Nodes},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, setting := range []string{"yes", "no"} {
				for _, n := range c.nodes {
					if err := n.Client().ConfigSet(ctx, "aof-load-truncated", setting).Err(); err != nil {
						t.Fatal(err)
					}
				}
				msg := TruncatedLoadWarning(ctx, c.rdb)
				if setting == "no" {
					if msg != "" {
						t.Fatalf("aof-load-truncated no: %q", msg)
					}
					continue
				}
				for _, n := range c.nodes {
					if !strings.Contains(msg, n.Addr()) {
						t.Fatalf("aof-load-truncated yes: %s not named in %q", n.Addr(), msg)
					}
				}
			}
		})
	}
}

// TestMetaEncoder: the encoder that keeps the transaction id and created-at while they repeat
// writes what appendMeta writes, message after message.
func TestMetaEncoder(t *testing.T) {
	ms := []Message{
		{Partition: "a", ID: "1", Tx: "t1", CreatedMs: 5},
		{Partition: "b", ID: "2", Tx: "t1", CreatedMs: 5, Header: []byte(`{"k":1}`)},
		{Partition: "c", ID: "3", Tx: "t2", CreatedMs: 5},
		{Partition: "d", ID: "4", Tx: "t2", CreatedMs: 6},
		{Partition: `"e"`, ID: "5", Tx: "", CreatedMs: 6},
	}
	var e metaEncoder
	for i := range ms {
		if got, want := e.append(nil, int64(i+1), &ms[i]), appendMeta(nil, int64(i+1), &ms[i]); string(got) != string(want) {
			t.Errorf("message %d: %s, want %s", i, got, want)
		}
	}
}

// TestWritePackBounds: in layout 3 the transaction and the write script pack a shard's messages
// alike: in order, at most PackMessages an entry, and at most PackBytes of payloads unless one
// message alone is larger (it then has an entry of its own).
func TestWritePackBounds(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	var sizes []int
	for i := 0; i < 150; i++ {
		sizes = append(sizes, 10) // 64, then 64, then 22 with what follows
	}
	sizes = append(sizes, 30000, 30000, 5000, PackBytes+1, 10, PackBytes, 1, PackBytes-1, 1)
	var want []int // messages per entry
	n, size := 0, 0
	for _, l := range sizes {
		if n == PackMessages || n > 0 && size+l > PackBytes {
			want, n, size = append(want, n), 0, 0
		}
		n, size = n+1, size+l
	}
	want = append(want, n)
	for _, script := range []bool{false, true} {
		t.Run(fmt.Sprintf("script=%v", script), func(t *testing.T) {
			q := fmt.Sprintf("pack%v", script)
			w := NewWriter(rdb, WriterConfig{Shards: 1, CreateVersion: LayoutV3})
			defer w.Close()
			w.scriptOnly = script
			batch := make([]Message, len(sizes))
			for i, l := range sizes {
				batch[i] = Message{Queue: q, Partition: "p", ID: fmt.Sprintf("m%d", i), Tx: "t", CreatedMs: 1,
					Payload: []byte(strings.Repeat(string(rune('a'+i%26)), l))}
			}
			if _, err := w.Write(ctx, batch, nil); err != nil {
				t.Fatal(err)
			}
			xs := rdb.XRange(ctx, w.Layout().Stream(q, 0), "-", "+").Val()
			var got []int
			i := 0
			for _, x := range xs {
				es := EntriesOf(nil, x)
				got = append(got, len(es))
				for _, e := range es {
					if e.MessageID != batch[i].ID || e.Offset != int64(i+1) || string(e.Payload) != string(batch[i].Payload) {
						t.Fatalf("message %d: %s off %d, %d bytes", i, e.MessageID, e.Offset, len(e.Payload))
					}
					i++
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("messages per entry %v, want %v", got, want)
			}
		})
	}
}

// TestWriteGivesUpOnUnreachableRedis: with UnreachableFor set, a write to a Redis that cannot be
// reached at all returns its dial error once that long has passed, though RetryFor is a minute; a
// write whose Redis comes back within it goes in.
func TestWriteGivesUpOnUnreachableRedis(t *testing.T) {
	r := testenv.StartRedis(t)
	msgs := []Message{{Queue: "u", Partition: "p", ID: "m1", Payload: []byte(`{}`)}}
	w := NewWriter(r.Client(), WriterConfig{RetryFor: time.Minute, UnreachableFor: 300 * time.Millisecond})
	if _, err := w.Write(t.Context(), msgs, nil); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // RetryFor alone would run past it
	defer cancel()
	if _, err := w.Write(ctx, msgs, nil); !redisconn.Unreachable(err) || ctx.Err() != nil {
		t.Fatalf("write to a Redis that is gone: %v (context %v), want its dial error before the context ends", err, ctx.Err())
	}
	r.Restart()
	if _, err := w.Write(t.Context(), msgs, nil); err != nil {
		t.Fatalf("write once Redis is back: %v", err)
	}
}
