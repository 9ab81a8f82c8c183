package oracle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// ReadQueue sees the queue at one moment: while a script writes one entry to every shard at once
// (as the queue's write does for a batch spread over shards), every read holds as many entries
// in each shard. Read shard by shard, a read sees a later shard's newer entries without the
// earlier shard's, and a test waiting for a marker in one shard misses what came before it.
func TestReadQueueIsOneMomentOfTheQueue(t *testing.T) {
	const shards = 4
	ctx := context.Background()
	r := testenv.StartRedis(t)
	rdb, w := r.Client(), r.Client()
	if err := rdb.HSet(ctx, redisconn.Key("pgrelay", "q", "meta"), "shards", shards).Err(); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, shards)
	for n := range keys {
		keys[n] = redisconn.Key("pgrelay", "q", "s", strconv.Itoa(n))
	}
	writeAll := redis.NewScript(`for i, k in ipairs(KEYS) do redis.call('XADD', k, '*', 'off', ARGV[1], 'p', 'p', 'id', ARGV[1], 'd', '{}') end return 1`)

	const writes = 3000 // bounded, so a slow (race-detector) run reads a small queue
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= writes; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := writeAll.Run(ctx, w, keys, i).Err(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for read := 0; ; read++ {
		select {
		case <-done:
			if read < 10 {
				t.Fatalf("only %d reads while the writes ran", read)
			}
			return
		default:
		}
		entries, err := ReadQueue(ctx, rdb, "pgrelay", "q")
		if err != nil {
			t.Fatal(err)
		}
		per := make([]int, shards)
		for _, e := range entries {
			per[e.Shard]++
		}
		for n := 1; n < shards; n++ {
			if per[n] != per[0] {
				t.Fatalf("read %d: entries per shard %v: a write to every shard was seen in part", read, per)
			}
		}
	}
}

// entriesOf reads every layout of DESIGN §4 on its own (encoding/json): a version-3 entry gives
// each message with its payload cut from d by its len in bytes; lengths that do not add up to d
// give an offset Check refuses.
func TestEntriesOfEveryLayout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"v1", map[string]any{"off": "3", "p": "a", "id": "m", "tx": "t", "ts": "1", "h": "", "d": "x"}, "[{0 3 a m t x}]"},
		{"v2", map[string]any{"m": `{"off":3,"p":"a","id":"m","tx":"t","ts":1}`, "d": "x"}, "[{0 3 a m t x}]"},
		{"v3", map[string]any{"m": `[{"off":3,"len":2,"p":"a","id":"m","tx":"t","ts":1},{"off":4,"len":4,"p":"b","id":"n","tx":"t","ts":1}]`, "d": "é😀"},
			"[{0 3 a m t é} {0 4 b n t 😀}]"},
		{"v3 lengths short", map[string]any{"m": `[{"off":3,"len":1,"p":"a","id":"m"}]`, "d": "xy"}, "[{0 -1 a m  x}]"},
		{"v3 lengths past d", map[string]any{"m": `[{"off":3,"len":3,"p":"a","id":"m"}]`, "d": "xy"}, "[{0 -1 a m  }]"},
		{"v3 not JSON", map[string]any{"m": `[{"off":3`, "d": "xy"}, "[{0 -1    xy}]"},
	} {
		var got []string
		for _, e := range entriesOf(0, redis.XMessage{Values: tc.values}) {
			got = append(got, fmt.Sprintf("{%d %d %s %s %s %s}", e.Shard, e.Off, e.Partition, e.ID, e.Tx, e.Payload))
		}
		if s := "[" + strings.Join(got, " ") + "]"; s != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, s, tc.want)
		}
	}
}
