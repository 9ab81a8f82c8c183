package source_test

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
)

// An append-only table streams its inserts only, with or without a key: it is published by the
// insert-only publication `<publication>_insert` (insert, truncate), so PostgreSQL runs its
// updates and deletes without a replica identity and does not send them, REPLICA IDENTITY FULL or
// not. A table without a key has `key: null` and is partitioned by a column or `single`; its rows
// already there are not snapshotted. Tables the start checks refuse (no key and not append-only;
// append-only without a key but partitioned by key) are left out of every publication, reported
// in the status hash with their codes, and the other tables stream (on_refused_table: skip).
func TestAppendOnlyTablesStreamInsertsOnly(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE k (id int PRIMARY KEY, v text);
		CREATE TABLE log (at timestamptz NOT NULL DEFAULT '2026-01-02 03:04:05+00', src text, msg text);
		CREATE TABLE flog (n int, msg text);
		ALTER TABLE flog REPLICA IDENTITY FULL;
		CREATE TABLE kao (id int PRIMARY KEY, v text);
		CREATE TABLE nokey (v text);
		CREATE TABLE keydefault (v text);
		INSERT INTO k VALUES (1, 'before');
		INSERT INTO log (src, msg) VALUES ('z', 'before')`)
	tables := `[{table: k, queue: q}, {table: log, queue: q, append_only: true, partition_by: [src]},
		{table: flog, queue: q, append_only: true, partition_by: single}, {table: kao, queue: q, append_only: true},
		{table: nokey, queue: q}, {table: keydefault, queue: q, append_only: true}]`
	e.run("ao", tables, "snapshot: initial")
	e.waitStatus("q", "ao", `"phase":"streaming"`)
	e.waitStatus("q", "ao", `"refused":[{"table":"public.nokey","code":"replica_identity"`)
	e.waitStatus("q", "ao", `{"table":"public.keydefault","code":"partition_by"`)

	pubs, err := source.PublicationSummary(e.ctx, e.pg.Pool(), "pgrelay_ao", "pgrelay_ao_insert")
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != 2 || pubs["pgrelay_ao"] != "t,t,t,t:k" || pubs["pgrelay_ao_insert"] != "t,f,f,t:flog,kao,log" {
		t.Fatalf("publications: %v", pubs)
	}

	// Updates and deletes of the append-only tables run (PostgreSQL would refuse them on a table
	// without a replica identity in a publication of updates) and are not streamed; so do those of
	// the refused table, which is in no publication.
	e.pg.Exec(`INSERT INTO log (src, msg) VALUES ('a', 'one'), ('b', 'two'), ('a', 'one')`)
	e.pg.Exec(`INSERT INTO flog VALUES (1, 'x'); INSERT INTO kao VALUES (1, 'x'); INSERT INTO nokey VALUES ('x')`)
	e.pg.Exec(`UPDATE log SET msg = 'changed' WHERE src = 'b'; DELETE FROM log WHERE src = 'a'`)
	e.pg.Exec(`UPDATE flog SET msg = 'y'; DELETE FROM flog; UPDATE kao SET v = 'y'; DELETE FROM kao; UPDATE nokey SET v = 'y'`)
	e.pg.Exec(`INSERT INTO log (src, msg) VALUES ('c', 'after')`)
	e.pg.Exec(`UPDATE k SET v = 'last' WHERE id = 1`) // the last transaction: once it is in, every other is

	var entries []oracle.Entry
	for done := false; !done; {
		entries = e.waitEntries("q", len(entries)+1)
		for _, en := range entries {
			done = done || strings.Contains(string(en.Payload), `"v":"last"`)
		}
	}
	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		t.Error(p)
	}
	var got []string
	for _, en := range entries {
		ev := event(t, en)
		var table, op string
		json.Unmarshal(ev["table"], &table)
		json.Unmarshal(ev["op"], &op)
		got = append(got, op+" "+table+" p="+en.Partition+" key="+string(ev["key"])+" after="+string(ev["after"]))
	}
	sort.Strings(got)
	logRow := func(src, msg string) string {
		return `{"at":"2026-01-02T03:04:05+00:00","src":"` + src + `","msg":"` + msg + `"}`
	}
	want := []string{
		`c public.flog p=all key=null after={"n":1,"msg":"x"}`,
		`c public.kao p=1 key={"id":1} after={"id":1,"v":"x"}`,
		`c public.log p=a key=null after=` + logRow("a", "one"),
		`c public.log p=a key=null after=` + logRow("a", "one"),
		`c public.log p=b key=null after=` + logRow("b", "two"),
		`c public.log p=c key=null after=` + logRow("c", "after"),
		`r public.k p=1 key={"id":1} after={"id":1,"v":"before"}`,
		`u public.k p=1 key={"id":1} after={"id":1,"v":"last"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// What pg_cdc avoids: in a publication of updates, PostgreSQL refuses the keyless table's UPDATE.
	e.pg.Exec(`CREATE PUBLICATION other FOR TABLE log`)
	_, err = e.pg.Pool().Exec(e.ctx, `UPDATE log SET msg = 'refused'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "does not have a replica identity and publishes updates") {
		t.Errorf("UPDATE of a keyless table in a publication of updates: %v", err)
	}
}

// A refused table is checked again at the next start: once it has a key, it joins like a table
// added to tables (snapshot: initial copies its rows while streaming) and leaves the status.
func TestRefusedTableJoinsOnceFixed(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE late (id int NOT NULL, v text);
		INSERT INTO late VALUES (1, 'before the fix')`)
	tables := `[{table: k, queue: q}, {table: late, queue: q}]`
	stop := e.run("fix", tables, "snapshot: initial")
	e.waitStatus("q", "fix", `"refused":[{"table":"public.late","code":"replica_identity"`)
	e.pg.Exec(`INSERT INTO late VALUES (2, 'while refused'); INSERT INTO k VALUES (1)`)
	e.waitEntries("q", 1)
	stop()
	e.pg.Exec(`ALTER TABLE late ADD PRIMARY KEY (id)`)
	e.run("fix", tables, "snapshot: initial")
	e.waitStatus("q", "fix", `"phase":"streaming","error":"","code":"","at"`)
	e.pg.Exec(`INSERT INTO late VALUES (3, 'after')`)
	e.waitTables("fix", "q", "public.k", "public.late")
	e.waitOracle("q", 30*time.Second, map[string][]string{"public.k": {"id"}, "public.late": {"id"}})
	st, _ := e.rd.Client().HGetAll(e.ctx, "pgrelay:{q}:src:fix:status").Result()
	for _, v := range st {
		if strings.Contains(v, `"phase":"streaming"`) && strings.Contains(v, "refused") {
			t.Errorf("the fixed table is still listed as refused: %s", v)
		}
	}
}

// on_refused_table: stop stops the whole source on a refused table, with its code, before any
// publication exists.
func TestRefusedTableStopsTheSourceWhenAsked(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE nokey (v text)`)
	e.run("stop", `[{table: k, queue: q}, {table: nokey, queue: q}]`, "on_refused_table: stop")
	e.waitStatus("q", "stop", `"phase":"error","error":"tables[1] (public.nokey): replica_identity: `)
	var pubs int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication`).Scan(&pubs)
	if pubs != 0 {
		t.Errorf("%d publications created by a stopped source", pubs)
	}
}
