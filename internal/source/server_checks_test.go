package source_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// The server checks of DESIGN §5 refuse what logical replication cannot work with, each with its
// code in the source's status: wal_level below logical, slot.failover before PostgreSQL 17, and
// PostgreSQL before 14.
// Nothing is created on a refused server: no publication, no slot.
func TestServerChecksRefuseWithCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		opts  []testenv.PGOption
		extra string
		code  string
	}{
		{"wal_level replica", []testenv.PGOption{testenv.WithPGSetting("wal_level = replica")}, "", `"code":"wal_level"`},
		{"failover on 15", []testenv.PGOption{testenv.WithPGVersion(15)}, "slot: {failover: true}", `"code":"version"`},
		{"PostgreSQL 13", []testenv.PGOption{testenv.WithPGVersion(13)}, "", `"code":"version"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &env{t: t, pg: testenv.StartPostgres(t, c.opts...), rd: testenv.StartRedis(t), ctx: context.Background()}
			e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text)`)
			stop := e.run("chk", `[{table: s, queue: q}]`, c.extra)
			e.waitStatus("q", "chk", c.code)
			stop()
			var pubs, slots int
			e.pg.Pool().QueryRow(e.ctx, `SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots)`).Scan(&pubs, &slots)
			if pubs != 0 || slots != 0 {
				t.Errorf("a refused server got %d publications and %d slots", pubs, slots)
			}
			if n := e.rd.Client().Exists(e.ctx, "pgrelay:{q}:src:chk:ptr").Val(); n != 0 {
				t.Error("a refused source wrote a pointer")
			}
		})
	}
}

// An unmanaged publication (publication.manage: false) is never changed: one that misses a
// configured table, or does not publish every operation, is refused with the code publication
// (a stream without them could not be made complete), and stays as it was.
func TestUnmanagedPublicationMissingATableIsRefused(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text);
		CREATE TABLE u (id int PRIMARY KEY, v text);
		CREATE PUBLICATION only_s FOR TABLE s;
		CREATE PUBLICATION inserts_only FOR TABLE s, u WITH (publish = 'insert')`)
	for _, c := range []struct{ name, pub string }{{"missing", "only_s"}, {"ops", "inserts_only"}} {
		stop := e.run(c.name, `[{table: s, queue: q`+c.name+`}, {table: u, queue: q`+c.name+`}]`,
			"publication: {name: "+c.pub+", manage: false}")
		e.waitStatus("q"+c.name, c.name, `"code":"publication"`)
		stop()
	}
	var tables int
	var publish string
	e.pg.Pool().QueryRow(e.ctx, `SELECT (SELECT count(*) FROM pg_publication_tables WHERE pubname = 'only_s'),
		(SELECT concat_ws(',', pubinsert, pubupdate, pubdelete) FROM pg_publication WHERE pubname = 'inserts_only')`).Scan(&tables, &publish)
	if tables != 1 || publish != "t,f,f" {
		t.Errorf("an unmanaged publication was changed: only_s has %d tables, inserts_only publishes %s", tables, publish)
	}
	var slots int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&slots)
	if slots != 0 {
		t.Errorf("%d slots created for refused sources", slots)
	}
}

// A key change leaves the TOASTed column out of the WAL; pg_cdc reads the row back to fill it.
// When the row is already gone by then (deleted by a later transaction the source has not reached),
// the `c` lists the column as unchanged instead of inventing a value, and the replay still ends
// where the table is (the later `d` follows).
func TestKeyChangeWhoseRowIsGoneAtReadBack(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE k (id int PRIMARY KEY, n int, big text);
		ALTER TABLE k ALTER COLUMN big SET STORAGE EXTERNAL;
		INSERT INTO k VALUES (1, 0, repeat('x', 30000)), (2, 0, repeat('y', 30000))`)
	stop := e.run("gone", `[{table: k, queue: q}]`, "")
	e.waitPointer("gone", "q")
	stop()
	// Written while no source runs: when it reads the key change, row 10 is already deleted.
	e.pg.Exec(`UPDATE k SET id = 10 WHERE id = 1`)
	e.pg.Exec(`DELETE FROM k WHERE id = 10`)
	e.pg.Exec(`UPDATE k SET id = 20 WHERE id = 2`) // still there: filled from the read-back
	e.run("gone", `[{table: k, queue: q}]`, "")
	entries := e.waitEntries("q", 5) // d + c of 1 → 10, d of 10, d + c of 2 → 20
	var sawGone, sawFilled bool
	for _, en := range entries {
		ev := event(t, en)
		if string(ev["op"]) != `"c"` {
			continue
		}
		var after map[string]json.RawMessage
		json.Unmarshal(ev["after"], &after)
		switch string(ev["key"]) {
		case `{"id":10}`:
			sawGone = true
			if _, has := after["big"]; has || !strings.Contains(string(ev["unchanged"]), `"big"`) {
				t.Errorf("c of a row gone at read-back: after has big: %v, unchanged %s", has, ev["unchanged"])
			}
		case `{"id":20}`:
			sawFilled = true
			if len(after["big"]) != 30002 || ev["unchanged"] != nil && string(ev["unchanged"]) != "null" {
				t.Errorf("c of a row still there: big is %d bytes, unchanged %s", len(after["big"]), ev["unchanged"])
			}
		}
	}
	if !sawGone || !sawFilled {
		t.Fatalf("missing c events (id 10: %v, id 20: %v)", sawGone, sawFilled)
	}
	e.checkOracle("q", "public.k", "id")
}
