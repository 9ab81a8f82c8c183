package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
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

// TestGroupNeeds: the lowest entry a group still needs, from its XINFO GROUPS line and the pending
// summary read after it. Consumers read and ack between the two reads, so a summary that comes
// back empty or above the group's last-delivered entry leaves that entry; retention never trims
// what the group has not been delivered.
func TestGroupNeeds(t *testing.T) {
	for _, c := range []struct {
		name    string
		g       redis.XInfoGroup
		pending *redis.XPending
		want    string
	}{
		{"nothing pending", redis.XInfoGroup{LastDeliveredID: "30-0"}, nil, "30-0"},
		{"pending below last delivered", redis.XInfoGroup{Pending: 3, LastDeliveredID: "30-0"}, &redis.XPending{Count: 3, Lower: "10-0", Higher: "30-0"}, "10-0"},
		{"acked between the two reads", redis.XInfoGroup{Pending: 3, LastDeliveredID: "30-0"}, &redis.XPending{}, "30-0"},
		{"acked and more read between the two reads", redis.XInfoGroup{Pending: 3, LastDeliveredID: "30-0"}, &redis.XPending{Count: 2, Lower: "40-0", Higher: "50-0"}, "30-0"},
		{"never delivered", redis.XInfoGroup{LastDeliveredID: "0-0"}, nil, "0-0"},
	} {
		if got := groupNeeds(c.g, c.pending); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
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

// TestLengthBoundAgreesWithCounting: the binary search over entry ids finds the same entry as
// counting messages back from the newest, in every layout, for every max_length from 1 to past the
// stream's length (near both ends, a sample between): entries of one to 64 messages, many in one millisecond (one batch's), some
// batches a few milliseconds apart, the oldest entries trimmed away (offsets not from 1).
func TestLengthBoundAgreesWithCounting(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	l := NewLayout("")
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range Layouts {
		q := fmt.Sprintf("v%d", v)
		w := NewWriter(rdb, WriterConfig{Shards: 1, CreateVersion: v})
		total := 0
		for i := range 40 {
			n := 1 + rng.IntN(150)
			batch := msgs(q, n, 1)
			for j := range batch {
				batch[j].ID = fmt.Sprintf("b%d-%d", i, j)
			}
			if _, err := w.Write(ctx, batch, nil); err != nil {
				t.Fatal(err)
			}
			total += n
			if rng.IntN(4) == 0 {
				time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
			}
		}
		stream := l.Stream(q, 0)
		third := rdb.XRangeN(ctx, stream, "-", "+", int64(rdb.XLen(ctx, stream).Val()/3)).Val()
		rdb.XTrimMinID(ctx, stream, third[len(third)-1].ID)
		xs := rdb.XRange(ctx, stream, "-", "+").Val()
		kept := 0
		for _, x := range xs {
			kept += int(messagesIn(x))
		}
		// counted back from the newest entry
		counted := func(maxLength int64) string {
			var n int64
			for i := len(xs) - 1; i >= 0; i-- {
				if n += messagesIn(xs[i]); n >= maxLength {
					return xs[i].ID
				}
			}
			return ""
		}
		for maxLength := int64(1); maxLength <= int64(kept)+3; maxLength++ {
			if maxLength > 64 && maxLength < int64(kept)-64 && rng.IntN(20) != 0 {
				continue // every bound near both ends, a twentieth of those between
			}
			got, err := lengthBound(ctx, rdb, stream, maxLength)
			if err != nil {
				t.Fatal(err)
			}
			want := counted(maxLength)
			if maxLength >= int64(kept) {
				want = "" // nothing to trim (counting names the oldest entry when it holds exactly max_length)
				if got != "" && got != third[len(third)-1].ID {
					t.Fatalf("layout %d, max_length %d of %d: bound %s, want none", v, maxLength, kept, got)
				}
				continue
			}
			if got != want {
				t.Fatalf("layout %d, max_length %d of %d messages: bound %s, counting gives %s", v, maxLength, kept, got, want)
			}
		}
	}
}

// TestTrimMaxLengthReadsLittle: with max_length, a trim reads a few entries per shard, not the
// max_length newest messages (here 20 MiB of them): Redis' own count of the bytes it sent.
func TestTrimMaxLengthReadsLittle(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	ctx := context.Background()
	l := NewLayout("")
	w := NewWriter(rdb, WriterConfig{Shards: 1})
	payload := []byte(`"` + strings.Repeat("x", 4094) + `"`)
	for i := range 60 {
		batch := msgs("q", 100, 1)
		for j := range batch {
			batch[j].ID = fmt.Sprintf("b%d-%d", i, j)
			batch[j].Payload = payload
		}
		if _, err := w.Write(ctx, batch, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := Trim(ctx, rdb, l, "q", Retention{MaxLength: 5000})
	if err != nil {
		t.Fatal(err)
	}
	sent := infoInt(t, rdb, "total_net_output_bytes")
	if sent > 4<<20 {
		t.Fatalf("the trim made Redis send %d bytes; the 5000 messages kept hold %d", sent, 5000*len(payload))
	}
	oldest := rdb.XRangeN(ctx, l.Stream("q", 0), "-", "+", 1).Val()[0]
	if first := firstOffset(oldest); n == 0 || first > 1001 {
		t.Fatalf("trimmed %d entries, oldest kept offset %d: want the entry holding offset 1001", n, first)
	}
	if last := lastOffset(oldest); last < 1001 {
		t.Fatalf("the oldest entry kept ends at offset %d, before 1001", last)
	}
}

// infoInt is the integer field name of Redis' INFO.
func infoInt(t *testing.T, rdb *redis.Client, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(context.Background(), "all").Val(), "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", name)
	return 0
}
