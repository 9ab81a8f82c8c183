package source_test

import (
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestRenamedTableKeepsStreaming: a configured table renamed while pg_cdc streams keeps streaming
// into its queue under its configured name (found by its oid: its changes were dropped as another
// table's before), and a key change after the rename reads its unchanged TOASTed value back from
// the table under its new name; the log says to set the new name. With pg_cdc stopped, changes
// made before and after a second rename are all streamed once pg_cdc starts with the new name
// (the first under the old name in the WAL, matched by oid), after the old name was refused with
// table_missing and a hint. The queue replays to the table.
func TestRenamedTableKeepsStreaming(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE orders (id int PRIMARY KEY, note text, body text);
		ALTER TABLE orders ALTER body SET STORAGE EXTERNAL`)
	logs := &testenv.SyncBuffer{}
	run := func(table string) func() {
		return runStream(t, cdctest.Pipeline{Name: "ren", DSN: e.pg.DSN(), Tables: fmt.Sprintf("[{table: %s, queue: qr}]", table),
			Redis: e.rd.URL(), LogLevel: "info"}.YAML(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	}
	stop := run("public.orders")
	e.waitPointer("ren", "qr")
	e.pg.Exec(`INSERT INTO orders VALUES (1, 'one', repeat('x', 5000))`)
	e.waitEntries("qr", 1)

	e.pg.Exec(`ALTER TABLE orders RENAME TO orders_old`)
	e.pg.Exec(`INSERT INTO orders_old VALUES (2, 'two', 'small')`)
	e.pg.Exec(`UPDATE orders_old SET id = 11 WHERE id = 1`) // body unchanged: read back
	entries := e.waitEntries("qr", 4)                       // c 1, c 2, and the move: d 1, c 11
	var moved bool
	for _, en := range entries {
		ev := event(t, en)
		if string(ev["table"]) != `"public.orders"` {
			t.Errorf("entry %s: table %s, want the configured public.orders", en.ID, ev["table"])
		}
		if strings.Contains(string(ev["after"]), `"id":11`) {
			moved = strings.Contains(string(ev["after"]), strings.Repeat("x", 5000))
		}
	}
	if !moved {
		t.Fatalf("the key change after the rename has no read-back body: %v", entries)
	}
	if !strings.Contains(logs.String(), "was renamed to public.orders_old") || !strings.Contains(logs.String(), "Set tables[].table to public.orders_old") {
		t.Fatalf("no warning of the rename in the log:\n%s", logs.String())
	}
	stop()

	e.pg.Exec(`INSERT INTO orders_old VALUES (3, 'three', 'small')`)
	e.pg.Exec(`ALTER TABLE orders_old RENAME TO orders_new`)
	e.pg.Exec(`INSERT INTO orders_new VALUES (4, 'four', 'small')`)
	stop = run("public.orders")
	e.waitStatus("qr", "ren", `"code":"table_missing"`)
	stop()
	if !strings.Contains(logs.String(), "if it was renamed, its new name") {
		t.Fatalf("table_missing without the hint for a renamed table:\n%s", logs.String())
	}
	stop = run("public.orders_new")
	defer stop()
	before := byID(entries)
	entries = e.waitEntries("qr", 6)
	for _, en := range entries {
		if _, seen := before[en.ID]; seen {
			continue
		}
		if ev := event(t, en); string(ev["table"]) != `"public.orders_new"` {
			t.Errorf("entry %s: table %s, want public.orders_new", en.ID, ev["table"])
		}
	}
	if !strings.Contains(logs.String(), "was named public.orders_old when changes now streamed were made") {
		t.Fatalf("no note of the earlier name in the log:\n%s", logs.String())
	}

	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		t.Error(p)
	}
	replayed := maps.Clone(res.Tables["public.orders"])
	maps.Copy(replayed, res.Tables["public.orders_new"])
	rows, err := oracle.TableRows(e.ctx, e.conn(), "public.orders_new", []string{"id"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range oracle.Compare(replayed, rows) {
		t.Error(d)
	}
}

// TestRenameDuringSnapshot: a table renamed while its snapshot reads it (the rename commits while
// a chunk's read waits for its lock, so that read fails on the old name) is read on under its new
// name, found by its oid, from where the snapshot was: every row once as an `r` event, the stream's
// changes made under either name in the queue too, and the log says to set the new name. A second
// table renamed before its snapshot starts is read the same way, and `pgrelay status` reads the
// snapshot's progress while the renamed table is read, with the estimate its owner read by the
// table's oid (none is found by the configured name) and no error.
func TestRenameDuringSnapshot(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 3000) i;
		CREATE TABLE b (id int PRIMARY KEY, v text);
		INSERT INTO b SELECT i, md5(i::text) FROM generate_series(1, 1000) i;
		ANALYZE a, b`)
	logs := &testenv.SyncBuffer{}
	tables, extra := "[{table: a, queue: q}, {table: b, queue: q}]", "snapshot: initial\nchunk_rows: 10"
	stop := runStream(t, cdctest.Pipeline{Name: "rs", DSN: e.pg.DSN(), Tables: tables, Redis: e.rd.URL(),
		Source: extra, LogLevel: "info"}.YAML(),
		slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	defer stop()
	cdctest.Wait(t, 60*time.Second, "a chunk of a written", func() (bool, string) { return e.cursorAfter("rs", "q") > 0, "" })
	tx := e.lockChunkReads("a")
	if _, err := tx.Exec(e.ctx, `UPDATE a SET v = 'before' WHERE id = 2999; ALTER TABLE a RENAME TO a_renamed; ALTER TABLE b RENAME TO b_renamed`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	tx = e.lockChunkReads("a_renamed") // the snapshot reads on under the new name, and waits here
	st, err := source.ReadStatus(e.ctx, sourceConfig(t, e.section("rs", "a", extra)))
	if err != nil || st.PostgresProblem != "" || st.Snapshot == nil || st.Snapshot.Table != "public.a" || st.Snapshot.RowsDone == 0 ||
		st.Snapshot.Estimate != 3000 {
		t.Errorf("status while the renamed table is read: %+v, %v", st, err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(`UPDATE a_renamed SET v = 'after' WHERE id IN (1, 3000); DELETE FROM a_renamed WHERE id = 2`)
	e.waitSnapshotDone("rs", "q", 60*time.Second)
	if !strings.Contains(logs.String(), "was renamed to public.a_renamed") {
		t.Errorf("no warning of the rename in the log:\n%s", logs.String())
	}
	e.pg.Exec(`ALTER TABLE a_renamed RENAME TO a; ALTER TABLE b_renamed RENAME TO b`) // the oracle reads the configured names
	e.waitOracle("q", 10*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
	read := map[string]int{}
	for _, en := range e.waitEntries("q", 4000) {
		if ev := event(t, en); string(ev["op"]) == `"r"` {
			read[string(ev["table"])+string(ev["key"])]++
		}
	}
	if len(read) < 3999 { // id 2 may be deleted before its chunk
		t.Errorf("%d rows read by the snapshot, want 3999 or 4000", len(read))
	}
	for k, n := range read {
		if n != 1 {
			t.Errorf("row %s read %d times", k, n)
		}
	}
}
