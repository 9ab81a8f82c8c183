package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestDeadLettersReplayAndInspect dead-letters messages through a consumer, inspects the queue, and
// replays them: each comes back once with the next offsets and its original fields.
func TestDeadLettersReplayAndInspect(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 1})
	batch := msgs("q", 6, 1)
	batch[2].Header = []byte(`{"trace":"x"}`)
	if _, err := w.Write(ctx, batch, nil); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, rdb, ConsumerConfig{MaxAttempts: 1})
	d := read(t, c, 10*time.Second)
	if err := c.Nack(ctx, d, map[int]error{1: errText2("bad 1"), 2: errText2("bad 2")}); err != nil {
		t.Fatal(err)
	}
	d = read(t, c, 10*time.Second)
	if len(d.Entries) != 4 {
		t.Fatalf("after dead-lettering 2: %d entries", len(d.Entries))
	}
	_ = c.Ack(ctx, d)

	in, err := Inspect(ctx, rdb, l, "q")
	if err != nil {
		t.Fatal(err)
	}
	if in.DeadLetters != 2 || in.Length != 6 || in.ShardInfo[0].LastOffset != 6 || in.Groups[0].Pending != 0 || in.Groups[0].Lag != 0 {
		t.Fatalf("inspect %+v", in)
	}
	dls, err := ListDeadLetters(ctx, rdb, l, "q", "g", 0)
	if err != nil || len(dls) != 2 || dls[0].MessageID != "m1" || dls[0].Error != "bad 1" || dls[1].Header != `{"trace":"x"}` {
		t.Fatalf("dead letters %+v %v", dls, err)
	}
	if n, err := ReplayDeadLetters(ctx, rdb, l, "q", dls, false); err != nil || n != 2 {
		t.Fatalf("replay %d %v", n, err)
	}
	if n, err := ReplayDeadLetters(ctx, rdb, l, "q", dls, false); err != nil || n != 0 {
		t.Fatalf("second replay of the same list %d %v", n, err)
	}
	d = read(t, c, 10*time.Second)
	if len(d.Entries) != 2 || d.Entries[0].Offset != 7 || d.Entries[1].Offset != 8 || d.Entries[0].MessageID != "m1" ||
		string(d.Entries[1].Header) != `{"trace":"x"}` || d.Entries[1].Tx != "tx1" || d.Entries[1].CreatedMs != batch[2].CreatedMs {
		t.Fatalf("replayed %+v", d.Entries)
	}
	_ = c.Ack(ctx, d)
	rdb.XGroupCreate(ctx, l.Stream("q", 0), "other", "0")
	if _, err := ReplayDeadLetters(ctx, rdb, l, "q", []DeadLetter{{EntryID: "1-1"}}, false); !errcode.Is(err, errcode.ReplayAllGroups) {
		t.Fatalf("two groups: %v", err)
	}
}

type errText2 string

func (e errText2) Error() string { return string(e) }

// TestReplayAcrossLayouts replays a dead letter of each layout version into a queue of each: the
// message comes back once, in the queue's layout, with the shard's next offset and its partition,
// id, transaction id, created-at, header and payload as they were.
func TestReplayAcrossLayouts(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	m := Message{Partition: `p "1" \ é`, ID: "m1", Tx: "t1", CreatedMs: 1700000000005, Header: []byte(`{"k":"v"}`), Payload: []byte(`{"i":1}`)}
	dead := map[int][]any{
		LayoutV1: {"off", "3", "p", m.Partition, "id", m.ID, "tx", m.Tx, "ts", "1700000000005", "h", string(m.Header), "d", string(m.Payload)},
		LayoutV2: {"m", string(appendMeta(nil, 3, &m)), "d", string(m.Payload)},
	}
	same := func(e Entry, off int64) bool {
		return e.Offset == off && e.Partition == m.Partition && e.MessageID == m.ID && e.Tx == m.Tx &&
			e.CreatedMs == m.CreatedMs && string(e.Header) == string(m.Header) && string(e.Payload) == string(m.Payload)
	}
	for _, dv := range []int{LayoutV1, LayoutV2} {
		for _, qv := range Layouts {
			t.Run(fmt.Sprintf("dead letter v%d into queue v%d", dv, qv), func(t *testing.T) {
				q := fmt.Sprintf("r%d%d", dv, qv)
				dl, x := replayOne(t, rdb, q, qv, dead[dv])
				if dl.Offset != 3 || dl.Partition != m.Partition || dl.Header != string(m.Header) {
					t.Fatalf("dead letter %+v", dl)
				}
				if want := map[int]int{LayoutV1: 7, LayoutV2: 2, LayoutV3: 2}[qv]; len(x.Values) != want {
					t.Errorf("fields %v, want %d", x.Values, want)
				}
				if es := EntriesOf(nil, x); len(es) != 1 || !same(es[0], 6) {
					t.Errorf("replayed %+v", es)
				}
			})
		}
	}
	// a queue of a layout version the script does not write: refused, the dead letter kept, the
	// shard untouched
	t.Run("into queue v4", func(t *testing.T) {
		ctx, l, q := context.Background(), NewLayout(""), "r4"
		dls := deadLetterIn(t, rdb, q, 4, dead[LayoutV2])
		if _, err := ReplayDeadLetters(ctx, rdb, l, q, dls, false); !errcode.Is(err, errcode.LayoutVersion) {
			t.Fatalf("replay into a version-4 queue: %v", err)
		}
		if n := rdb.XLen(ctx, l.DLQ(q)).Val(); n != 1 {
			t.Errorf("dead letters left %d, want 1", n)
		}
		if n := rdb.XLen(ctx, l.Stream(q, 0)).Val(); n != 0 {
			t.Errorf("shard has %d entries, want 0", n)
		}
		if off := rdb.HGet(ctx, l.Meta(q), "off:0").Val(); off != "5" {
			t.Errorf("off:0 %s, want 5", off)
		}
	})
}

// TestReplayKeepsTheWritersBytes replays dead letters whose fields the Lua script must re-encode
// for the queue's layout: a layout-1 dead letter into a layout-2 queue gets exactly the m object
// the writer itself would write (strings escaped the same way, a byte that is not UTF-8 as U+FFFD:
// valid JSON for every client), and a layout-2 dead letter into a layout-1 queue keeps its header's
// bytes (key order, big numbers and escapes as written, not re-encoded).
func TestReplayKeepsTheWritersBytes(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	cases := []struct {
		name   string
		dv, qv int
		m      Message
	}{
		{"not UTF-8, into layout 2", LayoutV1, LayoutV2, Message{Partition: "p\xff\xfe-\xe2\x82-\xed\xa0\x80-\xf4\x90\x80\x80-é", ID: "id\x00\x01\x1f\x7f\"\\\n\r\t/<>&",
			Tx: "t\xc0\xaf", CreatedMs: 1700000000005, Header: []byte(`{"k":"v"}`), Payload: []byte("\xff")}},
		{"line and paragraph separators, into layout 2", LayoutV1, LayoutV2, Message{Partition: "a\u2028b\u2029c\U0001F600", ID: "m", Tx: "t", CreatedMs: 1}},
		{"no header, into layout 2", LayoutV1, LayoutV2, Message{Partition: "p", ID: "m", Tx: "t", CreatedMs: 2, Payload: []byte(`{}`)}},
		{"not UTF-8, into layout 3", LayoutV1, LayoutV3, Message{Partition: "p\xff\xfe-\xe2\x82-é", ID: "id\x00\"\\", Tx: "t\xc0\xaf",
			CreatedMs: 1700000000005, Header: []byte(`{"k":"v"}`), Payload: []byte("\xff")}},
		{"from layout 2, into layout 3", LayoutV2, LayoutV3, Message{Partition: "p", ID: "m", Tx: "t", CreatedMs: 2, Payload: []byte(`{"i":1}`)}},
		{"header bytes, into layout 1", LayoutV2, LayoutV1, Message{Partition: "p/q", ID: "m", Tx: "t", CreatedMs: 3,
			Header: []byte(`{"z":12345678901234567890,"a":"x\/y","n":[1.50,{"h":{}}],"e":"\u00e9"}`), Payload: []byte(`{"i":1}`)}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			vals := []any{"off", "3", "p", m.Partition, "id", m.ID, "tx", m.Tx, "ts", strconv.FormatInt(m.CreatedMs, 10),
				"h", string(m.Header), "d", string(m.Payload)}
			if tc.dv == LayoutV2 {
				vals = []any{"m", string(appendMeta(nil, 3, &m)), "d", string(m.Payload)}
			}
			_, x := replayOne(t, rdb, fmt.Sprintf("b%d", i), tc.qv, vals)
			f := x.Values
			if tc.qv == LayoutV3 {
				var enc metaEncoder
				want := "[" + string(enc.appendPacked(nil, 6, &m)) + "]"
				if got := f[FieldMeta]; got != want {
					t.Errorf("m\n got %q\nwant %q", got, want)
				}
				if es := EntriesOf(nil, x); len(es) != 1 || es[0].Offset != 6 || es[0].CreatedMs != m.CreatedMs || string(es[0].Payload) != string(m.Payload) {
					t.Errorf("replayed entry does not decode: %+v", es)
				}
			} else if tc.qv == LayoutV2 {
				if got, want := f[FieldMeta], string(appendMeta(nil, 6, &m)); got != want {
					t.Errorf("m\n got %q\nwant %q", got, want)
				}
				if e := entryOf(x); e.Offset != 6 || e.CreatedMs != m.CreatedMs || e.Partition == "" {
					t.Errorf("replayed entry does not decode: %+v", e)
				}
			} else if f[FieldHeader] != string(m.Header) || f[FieldPartition] != m.Partition || f[FieldCreated] != strconv.FormatInt(m.CreatedMs, 10) {
				t.Errorf("fields %q, want h %q p %q", f, m.Header, m.Partition)
			}
			if f[FieldPayload] != string(m.Payload) {
				t.Errorf("d %q, want %q", f[FieldPayload], m.Payload)
			}
		})
	}
	t.Run("random bytes, into layout 2", func(t *testing.T) {
		q := "brandom"
		rdb.HSet(ctx, l.Meta(q), "shards", "1", "version", "2", "off:0", "0")
		rng := rand.New(rand.NewPCG(1, 2))
		var want []string
		for i := 0; i < 200; i++ {
			b := make([]byte, rng.IntN(12))
			for j := range b {
				b[j] = []byte{0x00, 0x1f, '"', '\\', 'a', 0x7f, 0x80, 0xbf, 0xc2, 0xe0, 0xe2, 0xa8, 0xed, 0xf0, 0xf4, 0x90, 0xff}[rng.IntN(17)]
			}
			m := Message{Partition: string(b), ID: strconv.Itoa(i), Tx: "t", CreatedMs: int64(i)}
			want = append(want, string(appendMeta(nil, int64(i+1), &m)))
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.DLQ(q), Values: []any{"off", "1", "p", m.Partition, "id", m.ID,
				"tx", m.Tx, "ts", strconv.Itoa(i), "h", "", "d", "", "group", "g", "error", "e", "attempts", "1", "failed_at", "1"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		dls, err := ListDeadLetters(ctx, rdb, l, q, "", 0)
		if err != nil || len(dls) != len(want) {
			t.Fatalf("dead letters %d %v", len(dls), err)
		}
		if n, err := ReplayDeadLetters(ctx, rdb, l, q, dls, false); err != nil || n != len(want) {
			t.Fatalf("replay %d %v", n, err)
		}
		xs, err := rdb.XRange(ctx, l.Stream(q, 0), "-", "+").Result()
		if err != nil || len(xs) != len(want) {
			t.Fatalf("queue %d %v", len(xs), err)
		}
		for i, x := range xs {
			if x.Values[FieldMeta] != want[i] {
				t.Errorf("entry %d: m\n got %q\nwant %q", i, x.Values[FieldMeta], want[i])
			}
		}
	})
}

// deadLetterIn makes q a one-shard queue of layout version qv (offset 5) whose dead-letter stream
// holds one dead letter of fields, and lists it.
func deadLetterIn(t *testing.T, rdb redis.UniversalClient, q string, qv int, fields []any) []DeadLetter {
	t.Helper()
	ctx := context.Background()
	l := NewLayout("")
	rdb.HSet(ctx, l.Meta(q), "shards", "1", "version", strconv.Itoa(qv), "off:0", "5")
	vals := append(slices.Clone(fields), "group", "g", "error", "e", "attempts", "3", "failed_at", "1")
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.DLQ(q), Values: vals}).Err(); err != nil {
		t.Fatal(err)
	}
	dls, err := ListDeadLetters(ctx, rdb, l, q, "", 0)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v %v", dls, err)
	}
	return dls
}

// replayOne makes q a one-shard queue of layout version qv whose shard's last offset is 5, adds one
// dead letter of the given entry fields, replays it, and returns the dead letter as listed and the
// entry it became in the queue.
func replayOne(t *testing.T, rdb redis.UniversalClient, q string, qv int, fields []any) (DeadLetter, redis.XMessage) {
	t.Helper()
	ctx := context.Background()
	l := NewLayout("")
	dls := deadLetterIn(t, rdb, q, qv, fields)
	if n, err := ReplayDeadLetters(ctx, rdb, l, q, dls, false); err != nil || n != 1 {
		t.Fatalf("replay %d %v", n, err)
	}
	xs, err := rdb.XRange(ctx, l.Stream(q, 0), "-", "+").Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("queue %v %v", xs, err)
	}
	return dls[0], xs[0]
}

// TestInspectRefusesUnknownLayout: `pgrelay queue info` (Inspect) on a queue of a layout version
// this code does not read refuses it with layout_version instead of reporting offsets and lags read
// as version 1's fields; queues of the versions it reads, and of none, are inspected.
func TestInspectRefusesUnknownLayout(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	l := NewLayout("")
	for _, k := range []struct {
		version string
		known   bool
	}{{"", true}, {"1", true}, {"2", true}, {"4", false}, {"2.1", false}} {
		q := "q" + k.version
		args := []any{"shards", "1", "off:0", "5"}
		if k.version != "" {
			args = append(args, "version", k.version)
		}
		if err := rdb.HSet(ctx, l.Meta(q), args...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream(q, 0), Values: []any{"x", "1", FieldPayload, "{}"}}).Err(); err != nil {
			t.Fatal(err)
		}
		in, err := Inspect(ctx, rdb, l, q)
		switch {
		case k.known && (err != nil || in.Length != 1 || in.ShardInfo[0].LastOffset != 5):
			t.Fatalf("version %q: %+v %v", k.version, in, err)
		case !k.known && !errcode.Is(err, errcode.LayoutVersion):
			t.Fatalf("version %q: want layout_version, got %+v %v", k.version, in, err)
		}
	}
}

// TestInspectCountsMessages: queue info counts messages, not stream entries, in a layout-3 queue
// (where Redis' own length, lag and pending count entries of several messages).
func TestInspectCountsMessages(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 1, CreateVersion: LayoutV3})
	writeBatches(t, w, "q", 3, 10)
	stream := l.Stream("q", 0)
	rdb.XGroupCreate(ctx, stream, "g", "0")
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	in, err := Inspect(ctx, rdb, l, "q")
	if err != nil {
		t.Fatal(err)
	}
	if in.Length != 30 || in.ShardInfo[0].FirstOffset != 1 || in.ShardInfo[0].LastOffset != 30 {
		t.Fatalf("info %+v", in)
	}
	if len(in.Groups) != 1 || in.Groups[0].Lag != 20 || in.Groups[0].Pending != 10 {
		t.Fatalf("groups %+v, want lag 20 and 10 pending", in.Groups)
	}
	// trimmed up to the entry after the last delivered one: the lag is what is kept after it
	xs := rdb.XRange(ctx, stream, "-", "+").Val()
	rdb.XAck(ctx, stream, "g", xs[0].ID)
	rdb.XTrimMinID(ctx, stream, xs[2].ID)
	if in, err = Inspect(ctx, rdb, l, "q"); err != nil || in.Length != 10 || in.Groups[0].Lag != 10 || in.Groups[0].Pending != 0 {
		t.Fatalf("after trim: %+v %v", in, err)
	}
}
