package queue

import (
	"context"
	"testing"
	"time"

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
