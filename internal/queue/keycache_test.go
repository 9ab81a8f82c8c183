package queue

import (
	"slices"
	"strconv"
	"testing"

	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// The cached keys are the layout's, for every shard asked for; a queue that gains shards gets new
// keys and the ones handed out before stay as they were.
func TestKeyCacheHoldsTheLayoutsKeys(t *testing.T) {
	c := keyCache{layout: NewLayout("app")}
	check := func(k *queueKeys, q string, shards int) {
		t.Helper()
		if k.meta != c.layout.Meta(q) {
			t.Errorf("%s meta %q, want %q", q, k.meta, c.layout.Meta(q))
		}
		if len(k.streams) != shards || len(k.offs) != shards || len(k.bulks) != shards {
			t.Fatalf("%s: %d streams, %d offs, %d bulks, want %d", q, len(k.streams), len(k.offs), len(k.bulks), shards)
		}
		for n := range shards {
			if want := c.layout.Stream(q, n); k.streams[n] != want || !slices.Equal(k.bulks[n], redisconn.AppendBulk(nil, want)) {
				t.Errorf("%s shard %d: %q / %q, want %q", q, n, k.streams[n], k.bulks[n], want)
			}
			if want := "off:" + strconv.Itoa(n); k.offs[n] != want {
				t.Errorf("%s shard %d: field %q, want %q", q, n, k.offs[n], want)
			}
		}
	}
	for _, tc := range []struct {
		queue       string
		ask, shards int // shards asked for; shards the keys have
	}{
		{"orders", 2, 2},
		{"orders", 1, 2},
		{"orders", 4, 4},
		{"other", 16, 16},
		{"orders", 3, 4},
	} {
		check(c.of(tc.queue, tc.ask), tc.queue, tc.shards)
	}
	before := c.of("grows", 2)
	after := c.of("grows", 3)
	check(before, "grows", 2)
	check(after, "grows", 3)
	if c.of("grows", 3) != after {
		t.Error("the same keys were made again")
	}
}
