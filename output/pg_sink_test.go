package output

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/sink"
)

// TestToSinkMessage: the queue position and created_at are read whether an input sets them as
// integers (redis_queue) or as strings, and a position that is not one is refused with its code.
func TestToSinkMessage(t *testing.T) {
	for _, tc := range []struct {
		name           string
		meta           map[string]any
		shard          int32
		offset, create int64
		hasPos, bad    bool
	}{
		{"integers", map[string]any{"queue": "q", "shard": int64(3), "offset": int64(42), "created_at": int64(1700000000000)}, 3, 42, 1700000000000, true, false},
		{"strings", map[string]any{"queue": "q", "shard": "3", "offset": "42", "created_at": "1700000000000"}, 3, 42, 1700000000000, true, false},
		{"no position", map[string]any{"partition": "p"}, 0, 0, 0, false, false},
		{"offset not a number", map[string]any{"queue": "q", "shard": int64(1), "offset": "x"}, 0, 0, 0, false, true},
		{"shard beyond int32", map[string]any{"queue": "q", "shard": int64(1) << 40, "offset": int64(1)}, 0, 0, 0, false, true},
		{"no queue", map[string]any{"shard": int64(1), "offset": int64(1)}, 0, 0, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := service.NewMessage([]byte(`{"id":1}`))
			for k, v := range tc.meta {
				m.MetaSetMut(k, v)
			}
			var sm sink.Message
			err := toSinkMessage(m, &sm)
			if tc.bad {
				if !errcode.Is(err, errcode.BadMetadata) {
					t.Fatalf("error %v, want %s", err, errcode.BadMetadata)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sm.HasPosition != tc.hasPos || sm.Shard != tc.shard || sm.Offset != tc.offset || sm.CreatedAt != tc.create || string(sm.Payload) != `{"id":1}` {
				t.Fatalf("got %+v", sm)
			}
		})
	}
}
