package sink

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// TestUnknownKeys: a payload key (cdc: a key of `after`) that names no column of the target is
// left out silently (ignore), left out and told once per key with its code and fix (warn, the
// default), or pauses the sink until the table has the column (pause): nothing of the batch is
// written, no message fails, and once the column is added the same batch writes every value.
// Each mode's batches go through the grouped path (3 messages) and the streamed or pieced one
// (100 messages); an escaped key is matched by its unescaped name.
func TestUnknownKeys(t *testing.T) {
	f := startPG(t)
	payload := func(mode Mode, id int) string {
		row := fmt.Sprintf(`{"id":%d,"a":"v%d","extra":"e%d","sp\u0061ce":"s%d"}`, id, id, id, id)
		if mode == ModeCDC {
			return fmt.Sprintf(`{"op":"c","table":"public.t","key":{"id":%d},"after":%s}`, id, row)
		}
		return row
	}
	batch := func(mode Mode, from, n int) []*Message {
		var out []*Message
		for i := from; i < from+n; i++ {
			out = append(out, msg("q", 0, int64(i), payload(mode, i)))
		}
		return out
	}
	for _, mode := range []Mode{ModeAppend, ModeUpsert, ModeCDC} {
		for _, policy := range []UnknownKeys{UnknownKeysIgnore, UnknownKeysWarn, "", UnknownKeysPause} {
			name := string(policy)
			if name == "" {
				name = "default"
			}
			t.Run(string(mode)+"/"+name, func(t *testing.T) {
				table := f.name("unknown")
				f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, a text)`)
				var mu sync.Mutex
				var told []string
				var retried []error
				ctx, stop := context.WithCancel(context.Background())
				defer stop()
				a, err := NewApplier(ctx, f.pool, Config{Name: f.name("sink"), Table: table, Mode: mode, CreateProgressTable: true, RequireProgress: true,
					RetryMax: 200 * time.Millisecond, UnknownKeys: policy, OnUnknownKey: func(w error) {
						mu.Lock()
						defer mu.Unlock()
						told = append(told, w.Error())
					}}, func(err error, _ Class, _ time.Duration) {
					mu.Lock()
					defer mu.Unlock()
					if retried = append(retried, err); len(retried) == 2 {
						stop() // the pause was retried once: end the write
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				rows := func() string {
					return strings.Join(f.queryStrings(t, `SELECT concat_ws('/', id, a, `+extraCols(f, t, table)+`) FROM `+table+` ORDER BY id`), ",")
				}
				want := func(n int, withExtra bool) string {
					var out []string
					for i := 1; i <= n; i++ {
						r := fmt.Sprintf("%d/v%d", i, i)
						if withExtra {
							r += fmt.Sprintf("/e%d/s%d", i, i)
						}
						out = append(out, r)
					}
					return strings.Join(out, ",")
				}

				if policy == UnknownKeysPause {
					if _, err := a.Write(ctx, batch(mode, 1, 3)); err == nil || !errcode.Is(err, errcode.Paused) {
						t.Fatalf("a batch with keys the table lacks: %v, want a pause", err)
					}
					for _, err := range retried {
						if errcode.Of(err) != errcode.TargetColumnMissing ||
							!strings.Contains(err.Error(), `payload keys "extra", "space" have no column in `+table) ||
							!strings.Contains(err.Error(), "ALTER TABLE "+table+" ADD COLUMN extra ..., ADD COLUMN space ...") {
							t.Fatalf("retried %v, want target_column_missing naming both keys and the ALTER TABLE", err)
						}
					}
					if got := rows(); got != "" {
						t.Fatalf("the paused batch wrote %q", got)
					}
					f.exec(t, `ALTER TABLE `+table+` ADD COLUMN extra text, ADD COLUMN space text`)
					res := write(t, a, batch(mode, 1, 3)...)
					if res.Applied != 3 {
						t.Fatalf("after ALTER TABLE: %+v, want 3 applied", res)
					}
					write(t, a, batch(mode, 4, 100)...)
					if got, w := rows(), want(103, true); got != w {
						t.Fatalf("rows after the columns were added:\n%s\nwant\n%s", got, w)
					}
					if len(told) != 0 {
						t.Fatalf("pause also told %v", told)
					}
					return
				}
				for _, b := range [][]*Message{batch(mode, 1, 3), batch(mode, 4, 100), batch(mode, 104, 3)} {
					if res := write(t, a, b...); res.Applied != len(b) {
						t.Fatalf("%+v, want %d applied", res, len(b))
					}
				}
				if got, w := rows(), want(106, false); got != w {
					t.Fatalf("rows:\n%s\nwant\n%s", got, w)
				}
				if policy == UnknownKeysIgnore {
					if len(told) != 0 {
						t.Fatalf("ignore told %v", told)
					}
					return
				}
				slices.Sort(told)
				if len(told) != 2 || !strings.Contains(told[0], `payload key "extra" names no column of `+table) ||
					!strings.Contains(told[1], `payload key "space" names no column`) || !strings.HasPrefix(told[0], string(errcode.TargetColumnMissing)+":") ||
					!strings.Contains(told[0], "ALTER TABLE "+table+" ADD COLUMN extra") {
					t.Fatalf("told %q, want each of extra and space once, coded, with the ALTER TABLE", told)
				}
			})
		}
	}

	// A message already applied (at or below its shard's offset) is skipped, whatever its keys:
	// a sink switched to pause is not held by a redelivery of what it wrote before.
	t.Run("pause/redelivered", func(t *testing.T) {
		table := f.name("unknown")
		f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, a text)`)
		name := f.name("sink")
		write(t, f.applier(t, Config{Name: name, Table: table, Mode: ModeUpsert, UnknownKeys: UnknownKeysWarn}), batch(ModeUpsert, 1, 2)...)
		a := f.applier(t, Config{Name: name, Table: table, Mode: ModeUpsert, UnknownKeys: UnknownKeysPause})
		if res := write(t, a, batch(ModeUpsert, 1, 2)...); res.Skipped != 2 {
			t.Fatalf("redelivered: %+v, want 2 skipped", res)
		}
	})
}

// extraCols is the extra and space columns when the table has them, for concat_ws.
func extraCols(f *pgFixture, t *testing.T, table string) string {
	n := f.one(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname IN ('extra', 'space') AND NOT attisdropped`, table)
	if n == "2" {
		return "extra, space"
	}
	return "NULL"
}
