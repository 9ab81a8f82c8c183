package input

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestQueueInputFailures(t *testing.T) {
	batch := service.MessageBatch{service.NewMessage([]byte("a")), service.NewMessage([]byte("b")), service.NewMessage([]byte("c"))}
	idx := batch.Index()
	plain := errors.New("boom")
	blocked := errcode.New(errcode.Blocked, "behind an earlier failure", "")
	paused := errcode.New(errcode.Paused, "sink paused", "fix the table")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"plain error: every message", plain, "[0 1 2]"},
		{"wrapped blocked: none", fmt.Errorf("write: %w", blocked), "[]"},
		{"wrapped paused: none", fmt.Errorf("write: %w", paused), "[]"},
		{"paused only in the text: every message", errors.New(paused.Error()), "[0 1 2]"},
		{"batch error: only the failed", service.NewBatchError(batch, plain).Failed(1, plain), "[1]"},
		{"batch error: blocked ones count none", service.NewBatchError(batch, plain).Failed(0, plain).Failed(2, blocked), "[0]"},
	}
	for _, c := range cases {
		got := failures(c.err, idx, len(batch))
		var keys []int
		for i := 0; i < len(batch); i++ {
			if _, ok := got[i]; ok {
				keys = append(keys, i)
			}
		}
		if s := fmt.Sprint(keys); s != c.want && !(c.want == "[]" && len(keys) == 0) {
			t.Errorf("%s: %v, want %s", c.name, keys, c.want)
		}
	}
}

func TestQueueInputHeaderMeta(t *testing.T) {
	cases := []struct {
		h    string
		want string
	}{
		{``, "map[]"},
		{`not json`, "map[]"},
		{`[1,2]`, "map[]"},
		{`{"trace":"t1","n":42,"f":1.5,"ok":true}`, "map[f:1.5(float64) n:42(int64) ok:true(bool) trace:t1(string)]"},
	}
	for _, c := range cases {
		got := headerMeta([]byte(c.h))
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s:%v(%T)", k, got[k], got[k]))
		}
		if s := "map[" + strings.Join(parts, " ") + "]"; s != c.want {
			t.Errorf("headerMeta(%q) = %s, want %s", c.h, s, c.want)
		}
	}
}
