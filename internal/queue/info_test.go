package queue

import (
	"context"
	"fmt"
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
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
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
		for _, qv := range []int{LayoutV1, LayoutV2} {
			t.Run(fmt.Sprintf("dead letter v%d into queue v%d", dv, qv), func(t *testing.T) {
				q := fmt.Sprintf("r%d%d", dv, qv)
				rdb.HSet(ctx, l.Meta(q), "shards", "1", "version", strconv.Itoa(qv), "off:0", "5")
				vals := append(slices.Clone(dead[dv]), "group", "g", "error", "e", "attempts", "3", "failed_at", "1")
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.DLQ(q), Values: vals}).Err(); err != nil {
					t.Fatal(err)
				}
				dls, err := ListDeadLetters(ctx, rdb, l, q, "", 0)
				if err != nil || len(dls) != 1 || dls[0].Offset != 3 || dls[0].Partition != m.Partition || dls[0].Header != string(m.Header) {
					t.Fatalf("dead letters %+v %v", dls, err)
				}
				if n, err := ReplayDeadLetters(ctx, rdb, l, q, dls, false); err != nil || n != 1 {
					t.Fatalf("replay %d %v", n, err)
				}
				xs, err := rdb.XRange(ctx, l.Stream(q, 0), "-", "+").Result()
				if err != nil || len(xs) != 1 {
					t.Fatalf("queue %v %v", xs, err)
				}
				if want := map[int]int{LayoutV1: 7, LayoutV2: 2}[qv]; len(xs[0].Values) != want {
					t.Errorf("fields %v, want %d", xs[0].Values, want)
				}
				if e := EntryOf(xs[0]); !same(e, 6) {
					t.Errorf("replayed %+v", e)
				}
			})
		}
	}
}
