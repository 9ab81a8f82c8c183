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

// TestQueueInputStartAfterLoad: start_after_load lints (its three forms, and start_from latest
// beside it), parses into the consumer's start, and a start the linter cannot judge (an xid in
// progress outside [xmin, xmax)) is refused at parse with bad_start.
func TestQueueInputStartAfterLoad(t *testing.T) {
	linter := service.GlobalEnvironment().NewComponentConfigLinter()
	conf := func(positions, snap, lsn, extra string) string {
		return fmt.Sprintf("redis_queue:\n  queue: q\n  group: g\n%s  start_after_load:\n    positions: %q\n    snapshot: %q\n    lsn: %q\n", extra, positions, snap, lsn)
	}
	cases := []struct{ name, yaml, want string }{
		{"ok", conf("1718000000000-0@3,0-0@0", "7512:7520:7514,7515", "0/1A2B3C4", ""), ""},
		{"ok without counts", conf("1718000000000-0,0-0", "7512:7520:", "1/0", "  start_from: earliest\n"), ""},
		{"bad positions", conf("$,0-0", "7512:7520:", "0/1", ""), "positions must match"},
		{"bad snapshot", conf("0-0", "7512-7520", "0/1", ""), "snapshot must match"},
		{"bad lsn", conf("0-0", "1:2:", "01A2B3C4", ""), "lsn must match"},
		{"with latest", conf("0-0", "1:2:", "0/1", "  start_from: latest\n"), "replaces start_from"},
	}
	for _, c := range cases {
		lints, err := linter.LintInputYAML([]byte(c.yaml))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var all []string
		for _, l := range lints {
			all = append(all, l.What)
		}
		text := strings.Join(all, "; ")
		if (c.want == "") != (len(lints) == 0) || (c.want != "" && !strings.Contains(text, c.want)) {
			t.Errorf("%s: lints %q, want %q", c.name, text, c.want)
		}
	}
	parse := func(yaml string) (RedisQueueConfig, error) {
		pc, err := RedisQueueSpec().ParseYAML(strings.TrimPrefix(strings.ReplaceAll(yaml, "\n  ", "\n"), "redis_queue:\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return RedisQueueConfigFromParsed(pc)
	}
	rc, err := parse(conf("1718000000000-0@3, 0-0@0", "7512:7520:7514", "0/1A2B3C4", ""))
	if err != nil {
		t.Fatal(err)
	}
	s := rc.Consumer.Start
	if s == nil || s.PositionsText() != "1718000000000-0@3,0-0@0" || s.SnapshotText() != "7512:7520:7514" || s.LSN.String() != "0/1A2B3C4" {
		t.Fatalf("start %+v", s)
	}
	if rc, err := parse("redis_queue:\n  queue: q\n  group: g\n"); err != nil || rc.Consumer.Start != nil {
		t.Fatalf("no start_after_load: %+v %v", rc.Consumer.Start, err)
	}
	if _, err := parse(conf("0-0", "7512:7520:7600", "0/1", "")); !errcode.Is(err, errcode.BadStart) {
		t.Fatalf("an xid in progress past xmax: %v, want bad_start", err)
	}
}
