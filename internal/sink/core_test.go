package sink

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestCore(t *testing.T) {
	f := startPG(t)
	ctx := context.Background()

	t.Run("progress table created concurrently by several replicas", func(t *testing.T) {
		table := "conc_" + f.name("s") + ".progress"
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				p, _ := NewProgress("x", table)
				errs[i] = p.Ensure(ctx, f.pool, true)
			}(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("replica %d: %v", i, err)
			}
		}
		if got := f.one(t, `SELECT count(*)::text FROM pg_class WHERE oid = to_regclass($1)`, table); got != "1" {
			t.Fatalf("table count %s", got)
		}
	})

	t.Run("hand-made progress table with the wrong shape is a coded error printing the DDL", func(t *testing.T) {
		schema := f.name("bad")
		f.exec(t, `CREATE SCHEMA `+schema)
		f.exec(t, `CREATE TABLE `+schema+`.progress (sink text, queue text, shard int, last_offset int, PRIMARY KEY (sink, queue))`)
		p, _ := NewProgress("x", schema+".progress")
		err := p.Ensure(ctx, f.pool, true)
		if !errcode.Is(err, errcode.ProgressTableMismatch) {
			t.Fatalf("err = %v, want progress_table_mismatch", err)
		}
		for _, want := range []string{"CREATE TABLE IF NOT EXISTS", "last_offset bigint", "PRIMARY KEY (sink, queue, shard)",
			"column last_offset is integer", "no column updated_at"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q:\n%v", want, err)
			}
		}
	})

	t.Run("missing progress table without create_progress_table", func(t *testing.T) {
		p, _ := NewProgress("x", f.name("nosuch")+".progress")
		err := p.Ensure(ctx, f.pool, false)
		if !errcode.Is(err, errcode.ProgressTableMissing) || !strings.Contains(err.Error(), "CREATE TABLE") {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("redelivered messages at or below the shard's offset are skipped", func(t *testing.T) {
		table := f.name("skip")
		f.exec(t, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, v int)`)
		a := f.applier(t, Config{Table: table, Mode: ModeAppend})
		res := write(t, a, msg("q", 0, 1, `{"v":1}`), msg("q", 0, 2, `{"v":2}`), msg("q", 1, 1, `{"v":10}`))
		if res.Applied != 3 {
			t.Fatalf("applied %d", res.Applied)
		}
		res = write(t, a, msg("q", 0, 2, `{"v":2}`), msg("q", 0, 3, `{"v":3}`), msg("q", 1, 1, `{"v":10}`), msg("q", 1, 2, `{"v":11}`))
		if res.Skipped != 2 || res.Applied != 2 || res.Outcomes[0] != Skipped || res.Outcomes[2] != Skipped {
			t.Fatalf("outcomes %v", res.Outcomes)
		}
		if got := strings.Join(f.queryStrings(t, `SELECT v::text AS x FROM `+table+` ORDER BY v`), ","); got != "1,2,3,10,11" {
			t.Fatalf("rows %s", got)
		}
		got := strings.Join(f.queryStrings(t, `SELECT shard || ':' || last_offset FROM pgrelay.sink_progress WHERE sink = $1 ORDER BY shard`, a.cfg.Name), ",")
		if got != "0:3,1:2" {
			t.Fatalf("progress %s", got)
		}
	})

	t.Run("offsets never move backwards and duplicates inside a batch apply once", func(t *testing.T) {
		table := f.name("back")
		f.exec(t, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, v int)`)
		a := f.applier(t, Config{Table: table, Mode: ModeAppend})
		write(t, a, msg("q", 0, 10, `{"v":10}`))
		res := write(t, a, msg("q", 0, 5, `{"v":5}`), msg("q", 0, 11, `{"v":11}`), msg("q", 0, 11, `{"v":11}`))
		if res.Outcomes[0] != Skipped || res.Outcomes[1] != Applied || res.Outcomes[2] != Skipped {
			t.Fatalf("outcomes %v", res.Outcomes)
		}
		if got := f.one(t, `SELECT last_offset::text FROM pgrelay.sink_progress WHERE sink = $1`, a.cfg.Name); got != "11" {
			t.Fatalf("offset %s", got)
		}
		if got := f.one(t, `SELECT string_agg(v::text, ',' ORDER BY v) FROM `+table); got != "10,11" {
			t.Fatalf("rows %s", got)
		}
	})

	t.Run("two writers of the same shards queue instead of deadlocking and apply each message once", func(t *testing.T) {
		table := f.name("race")
		f.exec(t, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, shard int, off bigint, UNIQUE (shard, off))`)
		name := f.name("sink")
		a1 := f.applier(t, Config{Name: name, Table: table, Mode: ModeAppend})
		a2 := f.applier(t, Config{Name: name, Table: table, Mode: ModeAppend})
		const shards, perShard = 8, 40
		var wg sync.WaitGroup
		for w, a := range []*Applier{a1, a2} {
			wg.Add(1)
			go func(w int, a *Applier) {
				defer wg.Done()
				for off := int64(1); off <= perShard; off += 5 {
					var batch []*Message
					// the two writers list the shards in opposite orders
					for s := 0; s < shards; s++ {
						shard := int32(s)
						if w == 1 {
							shard = int32(shards - 1 - s)
						}
						for o := off; o < off+5; o++ {
							batch = append(batch, msg("q", shard, o, fmt.Sprintf(`{"shard":%d,"off":%d}`, shard, o)))
						}
					}
					if _, err := a.Write(context.Background(), batch); err != nil {
						t.Errorf("writer %d: %v", w, err)
						return
					}
				}
			}(w, a)
		}
		wg.Wait()
		if got := f.one(t, `SELECT count(*)::text FROM `+table); got != fmt.Sprint(shards*perShard) {
			t.Fatalf("rows %s, want %d", got, shards*perShard)
		}
	})

	t.Run("messages without queue metadata are refused unless require_progress is false", func(t *testing.T) {
		table := f.name("noprog")
		f.exec(t, `CREATE TABLE `+table+` (v int)`)
		a := f.applier(t, Config{Table: table, Mode: ModeAppend})
		_, err := a.Write(ctx, []*Message{{Payload: []byte(`{"v":1}`)}})
		if !errcode.Is(err, errcode.NoProgressMetadata) {
			t.Fatalf("err = %v", err)
		}
		a.cfg.RequireProgress = false
		write(t, a, &Message{Payload: []byte(`{"v":1}`)}, &Message{Payload: []byte(`{"v":2}`)})
		if got := f.one(t, `SELECT string_agg(v::text, ',' ORDER BY v) FROM `+table); got != "1,2" {
			t.Fatalf("rows %s", got)
		}
	})

	t.Run("target checks at start", func(t *testing.T) {
		nokey := f.name("nokey")
		f.exec(t, `CREATE TABLE `+nokey+` (a int, b int)`)
		f.exec(t, `CREATE TABLE `+nokey+`_u (a int, b int, UNIQUE (b))`)
		f.exec(t, `CREATE ROLE `+nokey+`_ro LOGIN`)
		f.exec(t, `GRANT SELECT ON `+nokey+`_u TO `+nokey+`_ro`)
		cases := []struct {
			name string
			cfg  Config
			code errcode.Code
		}{
			{"missing table", Config{Table: "no_such_table", Mode: ModeAppend}, errcode.TargetMissing},
			{"upsert without a key", Config{Table: nokey, Mode: ModeUpsert}, errcode.TargetNoKey},
			{"key not unique", Config{Table: nokey + "_u", Mode: ModeUpsert, Key: []string{"a"}}, errcode.KeyNotUnique},
			{"key column missing", Config{Table: nokey + "_u", Mode: ModeUpsert, Key: []string{"zz"}}, errcode.KeyColumnMissing},
			{"metadata column missing", Config{Table: nokey, Mode: ModeAppend, Metadata: MetadataColumns{Offset: "off"}}, errcode.TargetColumnMissing},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				_, err := f.applierErr(c.cfg)
				if !errcode.Is(err, c.code) {
					t.Fatalf("err = %v, want %s", err, c.code)
				}
			})
		}
		// a name that differs only in letter case is named, written as `table` takes it
		mixed, lower := f.name("Mixed"), f.name("lower")
		f.exec(t, `CREATE TABLE "`+mixed+`" (a int); CREATE TABLE `+lower+` (a int)`)
		for _, c := range []struct{ table, want string }{
			{"public." + mixed, `table public.` + mixed + ` does not exist, but public."` + mixed + `" does. Fix: names are taken as in SQL: unquoted ones in lower case, quoted ones as written; set ` + "`table`" + ` to public."` + mixed + `"`},
			{`public."` + strings.ToUpper(lower) + `"`, `but public.` + lower + ` does`},
			{strings.ToUpper(`"` + lower + `"`), `but public.` + lower + ` does`},
			{"public.no_such_" + lower, "does not exist (or is not on the search_path)"},
		} {
			_, err := f.applierErr(Config{Table: c.table, Mode: ModeAppend})
			if !errcode.Is(err, errcode.TargetMissing) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("table %s: %v, want %q", c.table, err, c.want)
			}
		}
		a := f.applier(t, Config{Table: nokey + "_u", Mode: ModeUpsert, Key: []string{"b"}})
		if strings.Join(a.Target().Key, ",") != "b" {
			t.Fatalf("key %v", a.Target().Key)
		}
		// privileges, seen by a user who may only SELECT
		var tgt *Target
		conn, err := f.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		tx, _ := conn.Begin(ctx)
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+nokey+`_ro`); err != nil {
			t.Fatal(err)
		}
		tgt, err = Inspect(ctx, tx, nokey+"_u", TargetNeeds{Key: []string{"b"}, NeedKey: true, Privileges: []string{"INSERT", "UPDATE"}})
		if !errcode.Is(err, errcode.TargetPrivileges) || !strings.Contains(err.Error(), "GRANT INSERT, UPDATE") {
			t.Fatalf("err = %v (target %v)", err, tgt)
		}
	})

	t.Run("environment errors pause: retried and finally a paused error, nothing charged to messages", func(t *testing.T) {
		table := f.name("env")
		f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int)`)
		var mu sync.Mutex
		var codes []string
		cfg := Config{Name: f.name("sink"), Table: table, Mode: ModeUpsert, ProgressTable: DefaultProgressTable,
			CreateProgressTable: true, RequireProgress: true, RetryMax: 50 * time.Millisecond}
		a, err := NewApplier(ctx, f.pool, cfg, func(err error, c Class, _ time.Duration) {
			mu.Lock()
			codes = append(codes, c.String()+":"+string(errcode.Of(err)))
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		f.exec(t, `ALTER TABLE `+table+` RENAME TO `+table+`_gone`)
		wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer cancel()
		_, err = a.Write(wctx, []*Message{msg("q", 0, 1, `{"id":1,"v":1}`)})
		if !errcode.Is(err, errcode.Paused) {
			t.Fatalf("err = %v, want paused", err)
		}
		mu.Lock()
		if len(codes) < 2 || codes[0] != "environment:target_missing" {
			t.Fatalf("retries %v", codes)
		}
		mu.Unlock()
		// the table comes back: the same batch now applies (the shape is re-read)
		f.exec(t, `ALTER TABLE `+table+`_gone RENAME TO `+table)
		res := write(t, a, msg("q", 0, 1, `{"id":1,"v":1}`))
		if res.Applied != 1 || f.one(t, `SELECT v::text FROM `+table+` WHERE id = 1`) != "1" {
			t.Fatalf("after recovery: %+v", res)
		}
	})
}

// TestShapeChange: the sink re-reads the table after ALTER TABLE, whether PostgreSQL reports an
// error (a dropped column) or not (a new column, seen within about a second).
func TestShapeChange(t *testing.T) {
	f := startPG(t)
	table := f.name("shape")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, a text, b text)`)
	a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	write(t, a, msg("q", 0, 1, `{"id":1,"a":"x","b":"y","c":"ignored"}`))
	f.exec(t, `ALTER TABLE `+table+` ADD COLUMN c text`)
	time.Sleep(shapeCheckInterval + 100*time.Millisecond)
	write(t, a, msg("q", 0, 2, `{"id":2,"c":"new column"}`))
	f.exec(t, `ALTER TABLE `+table+` DROP COLUMN b`)
	write(t, a, msg("q", 0, 3, `{"id":3,"a":"after drop","b":"gone"}`))
	got := strings.Join(f.queryStrings(t, `SELECT concat_ws('/', id, a, c) FROM `+table+` ORDER BY id`), ",")
	if got != "1/x,2/new column,3/after drop" {
		t.Fatalf("rows %q", got)
	}
}

// TestProgressRowRecreated: a progress row deleted by hand (a teardown) is inserted again by the
// next batch even though the sink has seen it before.
func TestProgressRowRecreated(t *testing.T) {
	f := startPG(t)
	table := f.name("rec")
	f.exec(t, `CREATE TABLE `+table+` (v int)`)
	a := f.applier(t, Config{Table: table, Mode: ModeAppend})
	write(t, a, msg("q", 0, 1, `{"v":1}`))
	f.exec(t, `DELETE FROM pgrelay.sink_progress WHERE sink = $1`, a.cfg.Name)
	write(t, a, msg("q", 0, 2, `{"v":2}`))
	if got := f.one(t, `SELECT last_offset::text FROM pgrelay.sink_progress WHERE sink = $1`, a.cfg.Name); got != "2" {
		t.Fatalf("offset %s", got)
	}
}

// TestOneApplierManyBatchesInFlight: max_in_flight > 1 shares one Applier between goroutines
// writing different shards (run with -race).
func TestOneApplierManyBatchesInFlight(t *testing.T) {
	f := startPG(t)
	table := f.name("par")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int)`)
	a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	var wg sync.WaitGroup
	for s := 0; s < 4; s++ {
		wg.Add(1)
		go func(shard int32) {
			defer wg.Done()
			for off := int64(1); off <= 50; off += 10 {
				var batch []*Message
				for o := off; o < off+10; o++ {
					batch = append(batch, msg("q", shard, o, fmt.Sprintf(`{"id":%d,"n":%d}`, int(shard)*1000+int(o%7), o)))
				}
				if _, err := a.Write(context.Background(), batch); err != nil {
					t.Error(err)
					return
				}
			}
		}(int32(s))
	}
	wg.Wait()
	if got := f.one(t, `SELECT count(*) || '/' || sum(n) FROM `+table); got != "28/"+fmt.Sprint(4*(44+45+46+47+48+49+50)) {
		t.Fatalf("rows %s", got)
	}
}
