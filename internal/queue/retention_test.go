package queue

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestIDLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"1-0", "2-0", true}, {"2-0", "10-0", true}, {"5-3", "5-10", true}, {"5-3", "5-3", false}, {"0-0", "1-1", true},
	} {
		if got := idLess(c.a, c.b); got != c.want {
			t.Errorf("idLess(%s, %s) = %v", c.a, c.b, got)
		}
	}
}

func TestTrimKeepsUnacked(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 1, CreateVersion: LayoutV2}) // an entry per message
	if _, err := w.Write(ctx, msgs("q", 10, 1), nil); err != nil {
		t.Fatal(err)
	}
	// no groups: the policy alone
	if n, err := Trim(ctx, rdb, l, "q", Retention{MaxLength: 8}); err != nil || n != 2 {
		t.Fatalf("no groups: trimmed %d %v", n, err)
	}
	// group a has acked 3 of the 8 left, group b read 5 and acked 2
	stream := l.Stream("q", 0)
	rdb.XGroupCreate(ctx, stream, "a", "0")
	rdb.XGroupCreate(ctx, stream, "b", "0")
	xs := readN(t, rdb, stream, "a", 3)
	ackAll(t, rdb, stream, "a", xs)
	xs = readN(t, rdb, stream, "b", 5)
	ackAll(t, rdb, stream, "b", xs[:1])
	// b's entry 2 (index 1) is pending: nothing from it on may go, whatever the policy
	if n, err := Trim(ctx, rdb, l, "q", Retention{MaxLength: 1}); err != nil || n != 1 {
		t.Fatalf("trimmed %d %v", n, err)
	}
	ackAll(t, rdb, stream, "b", xs[1:5])
	// now a (last delivered: its 3rd) holds it back
	if n, err := Trim(ctx, rdb, l, "q", Retention{MaxAge: time.Nanosecond}); err != nil || n != 1 {
		t.Fatalf("trimmed %d %v", n, err)
	}
	if got := rdb.XLen(ctx, stream).Val(); got != 6 {
		t.Fatalf("%d left", got)
	}
}

// TestTrimMaxLengthCountsMessages: in layout 3 max_length keeps the entries that hold the newest
// max_length messages (the oldest of them may hold older messages too).
func TestTrimMaxLengthCountsMessages(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 1, CreateVersion: LayoutV3})
	writeBatches(t, w, "q", 10, 7)
	stream := l.Stream("q", 0)
	if n := rdb.XLen(ctx, stream).Val(); n != 10 {
		t.Fatalf("%d entries, want 10 of 7 messages", n)
	}
	if n, err := Trim(ctx, rdb, l, "q", Retention{MaxLength: 20}); err != nil || n != 7 {
		t.Fatalf("trimmed %d entries (%v), want 7: the newest 3 hold the newest 20 messages", n, err)
	}
	if n, err := Trim(ctx, rdb, l, "q", Retention{MaxLength: 21}); err != nil || n != 0 {
		t.Fatalf("trimmed %d entries (%v), want none", n, err)
	}
	if first := entryOf(rdb.XRangeN(ctx, stream, "-", "+", 1).Val()[0]); first.MessageID != "b7-0" || first.Offset != 50 {
		t.Fatalf("oldest kept %+v", first)
	}
}

func readN(t *testing.T, rdb *redis.Client, stream, group string, n int64) []redis.XMessage {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: group, Consumer: "c",
		Streams: []string{stream, ">"}, Count: n, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Messages
}

func ackAll(t *testing.T, rdb *redis.Client, stream, group string, xs []redis.XMessage) {
	t.Helper()
	for _, x := range xs {
		if err := rdb.XAck(context.Background(), stream, group, x.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
