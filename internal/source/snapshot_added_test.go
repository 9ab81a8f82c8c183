package source_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
)

// snapshotRows counts the snapshot's r events of each table in queue q.
func (e *env) snapshotRows(q string) map[string]int {
	e.t.Helper()
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", q)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	for _, en := range entries {
		var ev struct{ Op, Table string }
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			e.t.Fatal(err)
		}
		if ev.Op == "r" && strings.Contains(en.ID, ":s:") {
			out[ev.Table]++
		}
	}
	return out
}

// waitTables waits until the stored pointer lists exactly tables and no snapshot runs.
func (e *env) waitTables(name, q string, tables ...string) {
	e.t.Helper()
	cdctest.WaitEvery(e.t, 60*time.Second, 100*time.Millisecond, fmt.Sprintf("the pointer to list %v with its snapshot done", tables), func() (bool, string) {
		p, err := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{"+q+"}:src:"+name+":ptr")
		if err != nil {
			e.t.Fatal(err)
		}
		return p != nil && slices.Equal(p.Tables, tables) && string(p.Snapshot) == "null", fmt.Sprintf("pointer %+v", p)
	})
}

// A table added to `tables` after the initial snapshot is snapshotted on the next start, while the
// stream runs and a random writer changes both tables, without snapshotting the others again; a
// table removed and added back is snapshotted again. The replay of the queue equals both tables,
// every id once.
func TestTableAddedLaterIsSnapshotted(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text, n int);
		INSERT INTO a SELECT i, md5(i::text), i FROM generate_series(0, 299) i;`)
	extra := "snapshot: initial\nchunk_rows: 100\nmax_bundle_messages: 40"
	stop := e.run("add", `[{table: a, queue: q}]`, extra)
	e.waitTables("add", "q", "public.a")
	stop()

	e.pg.Exec(`CREATE TABLE b (k1 text, k2 text, v text, PRIMARY KEY (k1, k2))`)
	for i := 0; i < 500; i++ {
		e.pg.Exec(`INSERT INTO b VALUES ($1, 'k', md5($1))`, bKey(i))
	}
	w := startRandomWriter(t, e.pg.Pool(), 500)
	both := `[{table: a, queue: q}, {table: b, queue: q}]`
	stop = e.run("add", both, extra)
	e.waitTables("add", "q", "public.a", "public.b")
	// a: its 300 rows of the first snapshot, no more. b: its rows were inserted before it joined
	// the publication, so only its snapshot can bring them (the oracle below checks they all came;
	// the writer deletes some and the chunks drop rows it changes, so there is no fixed count).
	if got := e.snapshotRows("q"); got["public.a"] != 300 || got["public.b"] == 0 {
		t.Errorf("snapshot rows after adding b: %v (want a: 300 from the first snapshot only, b: some)", got)
	}
	// Removed, then added back: snapshotted again. Nothing writes to b from the moment it leaves
	// `tables` (changes the pointer has not passed by then are not streamed: deletes would be
	// missed, see docs/source.md), so the writer stops and the queue catches up first.
	time.Sleep(300 * time.Millisecond)
	w.halt()
	e.waitOracle("q", 30*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"k1", "k2"}})
	stop()
	stop = e.run("add", `[{table: a, queue: q}]`, extra)
	e.waitTables("add", "q", "public.a")
	stop()
	before := e.snapshotRows("q")["public.b"]
	var rows int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM b`).Scan(&rows)
	stop = e.run("add", both, extra)
	// The writer starts once b is back in the publication: a change before that is in the gap.
	cdctest.WaitEvery(t, 30*time.Second, 20*time.Millisecond, "b back in the publication", func() (bool, string) {
		var in bool
		e.pg.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = 'pgrelay_add' AND tablename = 'b')`).Scan(&in)
		return in, "not in it"
	})
	w = startRandomWriter(t, e.pg.Pool(), 500)
	e.waitTables("add", "q", "public.a", "public.b")
	time.Sleep(300 * time.Millisecond)
	w.halt()
	if got := e.snapshotRows("q")["public.b"]; got <= before {
		t.Errorf("b's snapshot rows went from %d to %d; b had %d rows", before, got, rows)
	}
	res := e.waitOracle("q", 30*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"k1", "k2"}})
	t.Logf("writer: %d statements; queue: %d events", w.n, res.Events)
	stop()
}

// A transaction that changed a table before the table joined the publication, and commits after,
// is never in the stream: PostgreSQL decides what to publish as of each change. So the snapshot of
// an added table must not read it before such transactions end, or it keeps the old row for good.
// Here the transaction is open while the source starts with b added, and commits a second later.
func TestSnapshotWaitsForTransactionsBegunBeforeTheTableJoined(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		CREATE TABLE b (id int PRIMARY KEY, v text);
		INSERT INTO b SELECT i, 'old' FROM generate_series(1, 3) i`)
	extra := "snapshot: initial"
	stop := e.run("join", `[{table: a, queue: q}]`, extra)
	e.waitTables("join", "q", "public.a")
	stop()
	tx, err := e.pg.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	if _, err := tx.Exec(e.ctx, `UPDATE b SET v = 'new' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	stop = e.run("join", `[{table: a, queue: q}, {table: b, queue: q}]`, extra)
	defer stop()
	time.Sleep(time.Second) // the source adds b to the publication and would read it now
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.waitTables("join", "q", "public.a", "public.b")
	e.waitOracle("q", 30*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
}
