package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// TestRoutes: an event table goes to the target of its entry by name, else its schema's, else `*`;
// a pattern's target takes the event table's name (quoted: case and odd characters kept); entries
// that cannot be read are refused.
func TestRoutes(t *testing.T) {
	r, err := ParseRoutes(map[string]string{
		"public.orders": `copy."Orders"`,
		"public.*":      "copy.*",
		"app.*":         "*",
		"*":             "rest.*",
		"sales.items":   "other.*",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ table, want string }{
		{"public.orders", `copy."Orders"`},
		{"public.order_items", `copy."order_items"`},
		{"public.Mixed Case", `copy."Mixed Case"`},
		{"app.users", `"app"."users"`},
		{"sales.items", `other."items"`},
		{"sales.other", `rest."other"`},
		{"noschema", ""},
	} {
		got, ok := r.Target(c.table)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("Target(%q) = %q %v, want %q", c.table, got, ok, c.want)
		}
	}
	if got := strings.Join(r.names(), ","); got != "public.orders,sales.items" {
		t.Errorf("names %s", got)
	}
	if _, ok := mustRoutes(t, map[string]string{"public.t": "copy.t"}).Target("public.u"); ok {
		t.Error("an unmapped table was mapped")
	}
	for _, bad := range []map[string]string{
		{},
		{"orders": "copy.orders"},
		{"public.": "copy.t"},
		{"*.orders": "copy.orders"},
		{"public.t_*": "copy.*"},
		{"public.*": "copy.t"},
		{"*": "copy.t"},
		{"public.*": "copy.t_*"},
		{"public.*": "*.*"},
		{"public.t": ""},
	} {
		if _, err := ParseRoutes(bad); !errcode.Is(err, errcode.SinkConfig) {
			t.Errorf("ParseRoutes(%v): %v, want sink_config", bad, err)
		}
	}
}

func mustRoutes(t testing.TB, m map[string]string) Routes {
	t.Helper()
	r, err := ParseRoutes(m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestUnresolvedTables: with tables, decoding an event of a table an entry maps and whose target
// the mode does not know yet asks for that table to be resolved (unresolvedError), read as the
// event is read: from pg_cdc's form or any other member order, inside an envelope the first such
// event's; a published message, an empty envelope or an event of an unmapped table asks nothing.
func TestUnresolvedTables(t *testing.T) {
	ev := func(op, table string) string {
		return `{"op":"` + op + `","table":` + table + `,"key":{"id":1},"after":{"id":1},"before":null}`
	}
	r := &routedMode{routes: mustRoutes(t, map[string]string{"public.*": "copy.*"}), targets: map[string]*routed{}}
	for _, c := range []struct{ payload, want string }{
		{ev("c", `"public.t"`), "public.t"},
		{ev("c", `"public.we\"ird"`), `public.we"ird`},
		{`{"table":"public.t","op":"u","key":{"id":1},"after":{"id":1}}`, "public.t"},
		{`{"op":"m","table":null,"key":null,"after":{"n":1},"before":null}`, ""},
		{ev("c", `"app.t"`), ""}, // no entry maps it: table_unmapped
		{`{"op":"x","id":"pg:1","events":[{"op":"m","table":null,"key":null,"after":{},"before":null},` + ev("u", `"public.b"`) + `,` + ev("c", `"app.t"`) + `,` + ev("d", `"public.a"`) + `]}`, "public.b"},
		{`{"op":"x","id":"pg:1","events":[` + ev("c", `"app.t"`) + `,` + ev("u", `"public.b"`) + `]}`, ""}, // fails whole: table_unmapped
		{`{"id":"pg:1","events":[` + ev("c", `"public.a"`) + `],"op":"x"}`, "public.a"},
		{`{"op":"x" ,"events":[` + ev("c", `"public.a"`) + `]}`, "public.a"},
		{`{"op":"x","events":[]}`, ""},
		{`{"op":"x","events":{"op":"c","table":"public.a"}}`, ""},
		{`{"op":"m","table":null,"key":null,"after":{"events":[` + ev("c", `"public.a"`) + `]},"before":null}`, ""},
	} {
		_, err := r.decode(&Message{Payload: []byte(c.payload)}, nil)
		got := ""
		if u, ok := errors.AsType[*unresolvedError](err); ok {
			got = u.table
		}
		if got != c.want {
			t.Errorf("decode(%s): %v, want %q unresolved", c.payload, err, c.want)
		}
	}
}

// TestCDCTables: one cdc sink keeping copies of several tables: each event goes to the target its
// table maps to, a batch of events of every table commits in one transaction (a data error in one
// table's message rolls back none of the others' and blocks its shard only), an event of an
// unmapped table is a table_unmapped data error, a mapped target created after the sink started
// is found (the batch waits for it, an environment error, and is then written), a column added to
// one target is written within the shape check, and a key change moves the row within its table.
func TestCDCTables(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE SCHEMA src_copy;
		CREATE TABLE src_copy.orders (id int PRIMARY KEY, total numeric);
		CREATE TABLE src_copy.items (order_id int, n int, sku text, PRIMARY KEY (order_id, n));
		CREATE TABLE named_target (id int PRIMARY KEY, v text)`)
	ev := func(op, table, key, after, before string) string {
		return `{"op":"` + op + `","table":"` + table + `","key":` + key + `,"after":` + after + `,"before":` + before + `,"lsn":"0/1","ts":"2026-10-03T06:15:03.583036Z","seq":0}`
	}
	retries := make(chan error, 100)
	cfg := Config{Name: f.name("sink"), Mode: ModeCDC, Tables: map[string]string{"public.*": "src_copy.*", "public.special": "named_target"},
		CreateProgressTable: true, RequireProgress: true, RetryMax: 50 * time.Millisecond, ProgressTable: DefaultProgressTable}
	ctx := context.Background()
	a, err := NewApplier(ctx, f.pool, cfg, func(err error, _ Class, _ time.Duration) {
		select {
		case retries <- err:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := func(sql string) string { return strings.Join(f.queryStrings(t, sql), ",") }

	res := write(t, a,
		msg("q", 0, 1, ev("c", "public.orders", `{"id":1}`, `{"id":1,"total":"10.50"}`, "null")),
		msg("q", 0, 2, ev("c", "public.items", `{"order_id":1,"n":1}`, `{"order_id":1,"n":1,"sku":"a"}`, "null")),
		msg("q", 0, 3, ev("c", "public.items", `{"order_id":1,"n":2}`, `{"order_id":1,"n":2,"sku":"b"}`, "null")),
		msg("q", 1, 1, ev("c", "public.special", `{"id":5}`, `{"id":5,"v":"named"}`, "null")),
		msg("q", 2, 1, ev("c", "other.t", `{"id":1}`, `{"id":1}`, "null")),
		msg("q", 2, 2, ev("c", "public.orders", `{"id":2}`, `{"id":2,"total":"1"}`, "null")),
		msg("q", 3, 1, ev("u", "public.orders", `{"id":1}`, `{"id":1,"total":"11"}`, "null")),
		msg("q", 3, 2, `{"op":"m","table":null,"key":null,"after":{"x":1}}`),
	)
	want := []Outcome{Applied, Applied, Applied, Applied, Failed, Blocked, Applied, Applied}
	for i, o := range want {
		if res.Outcomes[i] != o {
			t.Fatalf("outcomes %v, want %v (errs %v)", res.Outcomes, want, res.Errs)
		}
	}
	if !errcode.Is(res.Errs[4], errcode.TableUnmapped) || !strings.Contains(res.Errs[4].Error(), `"other.t"`) {
		t.Errorf("the unmapped event: %v", res.Errs[4])
	}
	if got := rows(`SELECT id || ':' || total FROM src_copy.orders ORDER BY id`); got != "1:11" {
		t.Errorf("orders %s", got)
	}
	if got := rows(`SELECT order_id || '.' || n || ':' || sku FROM src_copy.items ORDER BY 1`); got != "1.1:a,1.2:b" {
		t.Errorf("items %s", got)
	}
	if got := rows(`SELECT id || ':' || v FROM named_target`); got != "5:named" {
		t.Errorf("named_target %s", got)
	}

	// A table whose target does not exist yet: the batch waits (an environment error) and is
	// written once the table is created; nothing of it is written before.
	done := make(chan *Result, 1)
	go func() {
		r, err := a.Write(ctx, []*Message{
			msg("q", 0, 4, ev("c", "public.orders", `{"id":3}`, `{"id":3,"total":"3"}`, "null")),
			msg("q", 0, 5, ev("c", "public.later", `{"id":1}`, `{"id":1,"v":"late"}`, "null")),
		})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	select {
	case err := <-retries:
		if !errcode.Is(err, errcode.TargetMissing) {
			t.Fatalf("the retried error: %v, want target_missing", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no retry while the target is missing")
	}
	if got := rows(`SELECT count(*)::text FROM src_copy.orders WHERE id = 3`); got != "0" {
		t.Fatalf("a row of the waiting batch was written: %s", got)
	}
	f.exec(t, `CREATE TABLE src_copy.later (id int PRIMARY KEY, v text)`)
	if r := <-done; r == nil || r.Applied != 2 {
		t.Fatalf("after the target was created: %+v", r)
	}
	if got := rows(`SELECT id || ':' || v FROM src_copy.later`); got != "1:late" {
		t.Errorf("later %s", got)
	}

	// A column added to one target is written within the shape check; a key change moves the row.
	f.exec(t, `ALTER TABLE src_copy.items ADD COLUMN qty int`)
	time.Sleep(shapeCheckInterval + 100*time.Millisecond)
	res = write(t, a,
		msg("q", 0, 6, ev("u", "public.items", `{"order_id":1,"n":1}`, `{"order_id":1,"n":1,"sku":"a","qty":4}`, "null")),
		msg("q", 0, 7, ev("u", "public.orders", `{"id":9}`, `{"id":9,"total":"3"}`, `{"id":3}`)),
	)
	if res.Applied != 2 {
		t.Fatalf("applied %d: %v", res.Applied, res.Errs)
	}
	if got := rows(`SELECT order_id || '.' || n || ':' || coalesce(qty::text, '-') FROM src_copy.items ORDER BY 1`); got != "1.1:4,1.2:-" {
		t.Errorf("items after the new column %s", got)
	}
	if got := rows(`SELECT id || ':' || total FROM src_copy.orders ORDER BY id`); got != "1:11,9:3" {
		t.Errorf("orders after the key change %s", got)
	}
	got := rows(fmt.Sprintf(`SELECT shard || ':' || last_offset FROM pgrelay.sink_progress WHERE sink = '%s' ORDER BY shard`, cfg.Name))
	if got != "0:7,1:1,2:0,3:2" {
		t.Errorf("progress %s", got)
	}
}

// TestCDCTablesStartChecks: the targets of entries by name are checked at start (a missing one is
// target_missing before any message); those of patterns as their events come (their schema at
// start: TestPatternSchemasCheckedAtStart).
func TestCDCTablesStartChecks(t *testing.T) {
	f := startPG(t)
	_, err := f.applierErr(Config{Mode: ModeCDC, Tables: map[string]string{"app.*": "public.*", "public.t": "public.missing_target"}})
	if !errcode.Is(err, errcode.TargetMissing) || !strings.Contains(err.Error(), "missing_target") {
		t.Fatalf("start: %v, want target_missing naming missing_target", err)
	}
	if _, err := f.applierErr(Config{Mode: ModeCDC, Tables: map[string]string{"app.*": "public.*"}}); err != nil {
		t.Fatalf("a pattern's targets are not checked at start: %v", err)
	}
}

// TestCDCTablesForeignKey: a batch whose tables' ops, planned table by table, would break a
// foreign key between the targets (a parent deleted before its child) is written message by
// message, in message order, and every message is applied: the copies end as the events left the
// source. The batch is large enough to go in pieces. Adjacent truncates of the two tables (one
// TRUNCATE at the source) are one TRUNCATE here; the referenced table's alone pauses the sink with a
// fix that works (the referencing table truncated in the target).
func TestCDCTablesForeignKey(t *testing.T) {
	f := startPG(t)
	a := f.fkCopies(t, "fk")
	ev := fkEvent
	if res := write(t, a, msg("q", 0, 1, ev("c", "public.orders", 1, 0)), msg("q", 0, 2, ev("c", "public.items", 1, 1))); res.Applied != 2 {
		t.Fatalf("first batch: %v", res.Errs)
	}
	var msgs []*Message
	off := int64(2)
	add := func(p string) { off++; msgs = append(msgs, msg("q", 0, off, p)) }
	for i := 2; i <= 32; i++ {
		add(ev("c", "public.orders", i, 0))
		add(ev("c", "public.items", i, i))
	}
	add(ev("d", "public.items", 1, 1))
	add(ev("d", "public.orders", 1, 0))
	if pieceBounds(len(msgs)) == nil {
		t.Fatalf("%d messages do not go in pieces", len(msgs))
	}
	if res := write(t, a, msgs...); res.Applied != len(msgs) {
		t.Fatalf("applied %d of %d: %v", res.Applied, len(msgs), res.Errs)
	}
	if got := f.one(t, `SELECT count(*) || ':' || min(id) || '-' || max(id) FROM fk.orders`); got != "31:2-32" {
		t.Errorf("orders %s", got)
	}
	if got := f.one(t, `SELECT count(*) || ':' || count(*) FILTER (WHERE id = order_id) FROM fk.items`); got != "31:31" {
		t.Errorf("items %s", got)
	}

	// TRUNCATE fk.orders, fk.items at the source: two t events, one statement here (either table
	// alone is refused while the other references it)
	trunc := fkTruncate
	res := write(t, a, msg("q", 0, off+1, trunc("public.orders")), msg("q", 0, off+2, trunc("public.items")),
		msg("q", 0, off+3, ev("c", "public.orders", 100, 0)))
	if res.Applied != 3 {
		t.Fatalf("truncates: %v", res.Errs)
	}
	if got := f.one(t, `SELECT (SELECT string_agg(id::text, ',') FROM fk.orders) || '/' || (SELECT count(*) FROM fk.items)`); got != "100/0" {
		t.Errorf("after the truncates: %s", got)
	}

	// The truncate of the referenced table alone (its partner in the next batch) pauses the sink
	// with a fix that names both ways on.
	write(t, a, msg("q", 0, off+4, ev("c", "public.items", 100, 100)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := a.Write(ctx, []*Message{msg("q", 0, off+5, trunc("public.orders"))})
	if !errcode.Is(err, errcode.TargetChanged) || !strings.Contains(err.Error(), "truncate them in the target") || !strings.Contains(err.Error(), "envelopes") {
		t.Errorf("a lone truncate of the referenced table: %v", err)
	}
	f.exec(t, `TRUNCATE fk.items`)
	if res := write(t, a, msg("q", 0, off+5, trunc("public.orders")), msg("q", 0, off+6, trunc("public.items"))); res.Applied != 2 {
		t.Fatalf("after the referencing table was truncated by hand: %v", res.Errs)
	}
}

// TestPauseKeepsItsCause: when the context ends while a paused batch is being tried again (here
// the retry waits on a lock), Write returns the error that paused the sink, with its code and fix,
// not the shutdown that cut the retry short.
func TestPauseKeepsItsCause(t *testing.T) {
	f := startPG(t)
	a := f.fkCopies(t, "pk")
	write(t, a, msg("q", 0, 1, fkEvent("c", "public.orders", 1, 0)), msg("q", 0, 2, fkEvent("c", "public.items", 1, 1)))

	ctx := context.Background()
	holder, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	retries := 0
	a.onRetry = func(error, Class, time.Duration) {
		if retries++; retries == 1 {
			// the next attempt's TRUNCATE waits on this lock until the context ends
			if _, err := holder.Exec(ctx, `BEGIN; LOCK TABLE pk.orders IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Error(err)
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = a.Write(wctx, []*Message{msg("q", 0, 3, fkTruncate("public.orders"))})
	if _, rerr := holder.Exec(ctx, `ROLLBACK`); rerr != nil {
		t.Fatal(rerr)
	}
	if retries != 1 {
		t.Fatalf("%d retries, want 1 (the second attempt waits on the lock)", retries)
	}
	if !errcode.Is(err, errcode.Paused) || !errcode.Is(err, errcode.TargetChanged) || !strings.Contains(err.Error(), "truncate them in the target") {
		t.Errorf("Write = %v, want paused by target_changed with its fix", err)
	}
}

// TestStoppedDuringATransientRetry: when the context ends while a batch is retried after a
// transient error (a serialization failure, here raised by a trigger), Write names that error as
// what the retries were for, under paused, and does not call the sink paused by it.
func TestStoppedDuringATransientRetry(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE TABLE flaky (id int PRIMARY KEY);
		CREATE FUNCTION flaky_fail() RETURNS trigger LANGUAGE plpgsql AS
		  $$BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END$$;
		CREATE TRIGGER flaky_fail BEFORE INSERT ON flaky FOR EACH ROW EXECUTE FUNCTION flaky_fail()`)
	a := f.applier(t, Config{Table: "flaky", Mode: ModeUpsert})
	var classes []Class
	a.onRetry = func(_ error, c Class, _ time.Duration) { classes = append(classes, c) }
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // room for the first attempt on a loaded machine
	defer cancel()
	_, err := a.Write(ctx, []*Message{msg("q", 0, 1, `{"id":1}`)})
	if len(classes) == 0 || classes[0] != Transient {
		t.Fatalf("retried as %v, want transient", classes)
	}
	if !errcode.Is(err, errcode.Paused) || !strings.Contains(err.Error(), "40001") ||
		!strings.Contains(err.Error(), "retried after a transient error") || strings.Contains(err.Error(), "paused by an error") {
		t.Errorf("Write = %v, want the transient error named as what the retries were for", err)
	}
}

// TestPatternSchemasCheckedAtStart: the target schema of a `schema.*` entry of tables is checked at
// start, though its tables are found only as events come: a missing one is target_missing naming
// the entry, one the role may not use target_privileges with its GRANT; `*` (each table's own
// schema) checks nothing, and a quoted schema is found as written.
func TestPatternSchemasCheckedAtStart(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE SCHEMA "Copy"; CREATE SCHEMA locked;`+progressDDL+`;
		GRANT USAGE ON SCHEMA pgrelay TO PUBLIC; GRANT SELECT, INSERT, UPDATE ON pgrelay.sink_progress TO PUBLIC;
		CREATE TABLE public.t2 (id int PRIMARY KEY)`)
	f.pg.CreateRole("pat", "LOGIN", `GRANT USAGE ON SCHEMA "Copy" TO %s`, `GRANT SELECT, INSERT, UPDATE, DELETE ON public.t2 TO %s`)
	pool := f.rolePool(t, "pat")
	for _, c := range []struct {
		tables map[string]string
		code   errcode.Code
		want   string
	}{
		{map[string]string{"public.*": `"Copy".*`, "app.t": "public.t2"}, "", ""},
		{map[string]string{"*": "*"}, "", ""},
		{map[string]string{"public.*": "copy.*"}, errcode.TargetMissing, `schema copy of tables entry "public.*" does not exist`},
		{map[string]string{"*": "nosuch.*", "public.*": `"Copy".*`}, errcode.TargetMissing, `schema nosuch of tables entry "*"`},
		{map[string]string{"public.*": "locked.*"}, errcode.TargetPrivileges, `GRANT USAGE ON SCHEMA "locked" TO "pat"`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := NewApplier(ctx, pool, Config{Name: f.name("pat"), Mode: ModeCDC, Tables: c.tables,
			ProgressTable: DefaultProgressTable, RequireProgress: true}, nil)
		cancel()
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%v: %v", c.tables, err)
		case c.code != "" && (!errcode.Is(err, c.code) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %s with %q", c.tables, err, c.code, c.want)
		}
	}
}

// TestOtherTablesTold: a cdc sink of one table applies every event to it whatever its table, and
// tells each table after the first one it meets, once (an envelope's events too); a table that is
// not a string is neither told nor refused, as before the sink followed its tables.
func TestOtherTablesTold(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE TABLE one_copy (id int PRIMARY KEY)`)
	var mu sync.Mutex
	var told []string
	a := f.applier(t, Config{Mode: ModeCDC, Table: "one_copy", OnOtherTable: func(first, table string) {
		mu.Lock()
		told = append(told, first+">"+table)
		mu.Unlock()
	}})
	ev := func(table string, id int) string {
		return fmt.Sprintf(`{"op":"c","table":%q,"key":{"id":%d},"after":{"id":%d},"before":null}`, table, id, id)
	}
	write(t, a, msg("q", 0, 1, ev("public.a", 1)), msg("q", 0, 2, ev("public.a", 2)), msg("q", 0, 3, ev("public.b", 3)))
	write(t, a, msg("q", 0, 4, envelope(ev("public.c", 4), ev("public.a", 5), ev("public.b", 6))), msg("q", 0, 5, ev("public.b", 7)),
		msg("q", 0, 6, `{"op":"c","table":8,"key":{"id":8},"after":{"id":8},"before":null}`))
	if got := strings.Join(told, ","); got != "public.a>public.b,public.a>public.c" {
		t.Errorf("told %s", got)
	}
	if got := f.one(t, `SELECT string_agg(id::text, ',' ORDER BY id) FROM one_copy`); got != "1,2,3,4,5,6,7,8" {
		t.Errorf("rows %s", got)
	}
}

// TestInto: where a sink writes, as status prints it.
func TestInto(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Table: "public.t"}, "public.t"},
		{Config{Tables: map[string]string{"public.*": "copy.*", "app.t": `x."T"`}}, `tables app.t → x."T", public.* → copy.*`},
		{Config{}, ""},
	} {
		if got := c.cfg.Into(); got != c.want {
			t.Errorf("Into() = %q, want %q", got, c.want)
		}
	}
}

// TestCDCTablesSkipUnmapped: with SkipUnmapped (on_unmapped_table: skip) an event of a table no
// entry maps is applied as nothing (its offset moves on, nothing is written), the others as usual,
// and each skipped table is told once.
func TestCDCTablesSkipUnmapped(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE SCHEMA sk; CREATE TABLE sk.orders (id int PRIMARY KEY)`)
	var told []string
	cfg := Config{Mode: ModeCDC, Tables: map[string]string{"public.orders": "sk.orders"}, SkipUnmapped: true,
		OnUnmapped: func(table string) { told = append(told, table) }}
	a := f.applier(t, cfg)
	ev := func(table string, id int) string {
		return fmt.Sprintf(`{"op":"c","table":%q,"key":{"id":%d},"after":{"id":%d},"before":null}`, table, id, id)
	}
	res := write(t, a, msg("q", 0, 1, ev("public.customers", 1)), msg("q", 0, 2, ev("public.orders", 1)),
		msg("q", 0, 3, ev("public.customers", 2)), msg("q", 0, 4, ev("app.users", 1)))
	if res.Applied != 4 {
		t.Fatalf("applied %d: %v", res.Applied, res.Errs)
	}
	if got := f.one(t, `SELECT string_agg(id::text, ',') FROM sk.orders`); got != "1" {
		t.Errorf("orders %s", got)
	}
	if got := strings.Join(told, ","); got != "public.customers,app.users" {
		t.Errorf("told %s", got)
	}
	if got := f.one(t, `SELECT last_offset::text FROM pgrelay.sink_progress WHERE sink = $1`, a.cfg.Name); got != "4" {
		t.Errorf("progress %s", got)
	}
}

// TestCDCTruncatesStayTogether: adjacent truncates of tables that reference each other (one
// TRUNCATE at the source) go as one statement wherever the batch is cut: at the boundary of its
// pieces, and message by message after another message's data error. Either split would leave the
// referenced table's TRUNCATE alone, which PostgreSQL refuses, and pause the sink.
func TestCDCTruncatesStayTogether(t *testing.T) {
	f := startPG(t)
	a := f.fkCopies(t, "tt")
	trunc := fkTruncate
	state := func() string {
		return f.one(t, `SELECT coalesce((SELECT string_agg(id::text, ',' ORDER BY id) FROM tt.orders), '-') || '/' ||
			coalesce((SELECT string_agg(id::text, ',' ORDER BY id) FROM tt.items), '-')`)
	}

	// the pieces' boundary falls between the two truncates
	var msgs []*Message
	off := int64(0)
	add := func(shard int32, p string) { off++; msgs = append(msgs, msg("q", shard, off, p)) }
	for i := 1; i <= 15; i++ {
		add(0, fkEvent("c", "public.orders", i, 0))
		add(0, fkEvent("c", "public.items", i, i))
	}
	add(0, fkEvent("c", "public.orders", 99, 0))
	if b := pieceBounds(len(msgs) + 33); b == nil || b[0][1] != len(msgs)+1 {
		t.Fatalf("setup: the first piece ends at %v, want after message %d", b, len(msgs)+1)
	}
	add(0, trunc("public.orders"))
	add(0, trunc("public.items"))
	for i := 1; i <= 31; i++ {
		add(0, fkEvent("c", "public.orders", 100+i, 0))
	}
	if res := write(t, a, msgs...); res.Applied != len(msgs) {
		t.Fatalf("across the pieces: applied %d of %d: %v", res.Applied, len(msgs), res.Errs)
	}
	if got := state(); !strings.HasPrefix(got, "101,") || !strings.HasSuffix(got, ",131/-") {
		t.Fatalf("across the pieces: %s", got)
	}

	// message by message: another shard's message fails (an item of no order)
	f.exec(t, `INSERT INTO tt.items VALUES (1, 101)`)
	res := write(t, a, msg("q", 1, 1, fkEvent("c", "public.items", 2, 999)),
		msg("q", 0, off+1, trunc("public.orders")), msg("q", 0, off+2, trunc("public.items")),
		msg("q", 0, off+3, fkEvent("c", "public.orders", 7, 0)))
	if want := []Outcome{Failed, Applied, Applied, Applied}; !slices.Equal(res.Outcomes, want) {
		t.Fatalf("message by message: %v, want %v (%v)", res.Outcomes, want, res.Errs)
	}
	if got := state(); got != "7/-" {
		t.Fatalf("message by message: %s", got)
	}
}
