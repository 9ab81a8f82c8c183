package source_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
)

// TestColumnListKeepsOtherColumnsInPostgres runs pg_cdc with `columns` on a table holding a secret
// column, as a role that may SELECT only the listed columns, with `snapshot: initial` and the
// publication created by pg_cdc's administrator with that column list: the snapshot, inserts,
// updates (one changing only the secret, one leaving a TOASTed listed value unchanged so it is
// read back), a key change and a delete all reach the queue with exactly the listed columns, in
// table order; no entry holds the secret; and the queue replays to the table's listed columns.
// Before PostgreSQL 15 the table is refused with column_list.
func TestColumnListKeepsOtherColumnsInPostgres(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE acct (id int PRIMARY KEY, name text, secret text, big text)`)
	if e.pg.Version < 15 {
		stop := e.run("cols", `[{table: acct, queue: qc, columns: [id, name]}]`, "")
		e.waitStatus("qc", "cols", `"code":"column_list"`)
		stop()
		return
	}
	e.pg.Exec(`ALTER TABLE acct ALTER big SET STORAGE EXTERNAL;
		INSERT INTO acct SELECT g, 'n' || g, 'SECRET-' || g, repeat('b', 4000) || g FROM generate_series(1, 40) g;
		CREATE PUBLICATION acct_pub FOR TABLE acct (id, name, big);
		CREATE VIEW acct_listed AS SELECT id, name, big FROM acct`)
	e.pg.CreateRole("colcdc", "LOGIN REPLICATION", `GRANT SELECT (big, name, id) ON acct TO %s`)
	startStream(t, fmt.Sprintf(`
input:
  pg_cdc:
    name: cols
    dsn: %s
    tables: [{table: acct, queue: qc, columns: [big, id, name]}]
    publication: {name: acct_pub, manage: false}
    snapshot: initial
    redis: {url: %[2]s}
    lease_ttl: 3s
output:
  redis_queue:
    url: %[2]s
logger:
  level: warn
`, e.pg.UserDSN("colcdc", "postgres"), e.rd.URL()))
	e.waitEntries("qc", 40)
	e.pg.Exec(`INSERT INTO acct VALUES (41, 'n41', 'SECRET-41', 'small');
		UPDATE acct SET secret = 'SECRET-changed' WHERE id = 1;
		UPDATE acct SET name = 'renamed' WHERE id = 2;
		UPDATE acct SET id = 100 WHERE id = 3;
		DELETE FROM acct WHERE id = 4`)
	e.pg.Exec(`INSERT INTO acct VALUES (999, 'last', 'SECRET-999', 'x')`) // committed after the others
	var entries []oracle.Entry
	cdctest.Wait(t, 30*time.Second, "the last insert in the queue", func() (bool, string) {
		var err error
		if entries, err = oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "qc"); err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			if strings.Contains(string(en.Payload), `"name":"last"`) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d entries", len(entries))
	})
	for _, en := range entries {
		if strings.Contains(string(en.Payload), "SECRET") || strings.Contains(string(en.Payload), `"secret"`) {
			t.Errorf("entry %s holds the unlisted column: %s", en.ID, en.Payload)
		}
		ev := event(t, en)
		var op string
		var unchanged []string
		_ = json.Unmarshal(ev["op"], &op)
		_ = json.Unmarshal(ev["unchanged"], &unchanged)
		var want []string // the listed columns in table order, but those PostgreSQL did not send
		for _, c := range []string{"id", "name", "big"} {
			if !slices.Contains(unchanged, c) {
				want = append(want, c)
			}
		}
		if op != "d" {
			if got := objectKeys(t, ev["after"]); got != strings.Join(want, ",") {
				t.Errorf("entry %s (%s): after has columns %s, want %s", en.ID, op, got, strings.Join(want, ","))
			}
		}
	}
	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		t.Error(p)
	}
	rows, err := oracle.TableRows(e.ctx, e.conn(), "public.acct_listed", []string{"id"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range oracle.Compare(res.Tables["public.acct"], rows) {
		t.Error(d)
	}
	if len(rows) != 41 { // 40, + 41 and 999, − 4 (the key change keeps the count)
		t.Errorf("%d rows in the table, want 41", len(rows))
	}
}

// objectKeys is the member names of a JSON object, in their order, joined by ",".
func objectKeys(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	var keys []string
	if _, err := dec.Token(); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	return strings.Join(keys, ",")
}

// TestTableLeavingThePublicationEndsTheSession: a table taken out of pg_cdc's managed publication
// while it streams (ALTER PUBLICATION … DROP TABLE) ends the session with a publication error
// instead of streaming on without its changes; the next start puts the table back and, with
// `snapshot: initial`, reads it again, so the queue replays to the table although the changes made
// while it was out (an insert, an update) were never sent by PostgreSQL.
func TestTableLeavingThePublicationEndsTheSession(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY, v text)`)
	e.run("drift", `[{table: a, queue: qd}, {table: b, queue: qd}]`, "heartbeat: 1s\nsnapshot: initial")
	e.waitStatus("qd", "drift", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 'one')`)
	e.waitEntries("qd", 2)
	e.pg.Exec(`ALTER PUBLICATION pgrelay_drift DROP TABLE b`)
	e.pg.Exec(`INSERT INTO b VALUES (2, 'two')`) // committed while b is out: not sent
	e.pg.Exec(`UPDATE b SET v = 'changed' WHERE id = 1`)
	e.waitStatus("qd", "drift", `publication pgrelay_drift no longer holds public.b`)
	e.waitStatus("qd", "drift", `"phase":"streaming"`)
	var n int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'pgrelay_drift' AND tablename = 'b'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("b not put back in the publication: %d %v", n, err)
	}
	e.pg.Exec(`INSERT INTO b VALUES (3, 'three')`)
	e.waitReadAgain("qd", `"v":"three"`)
	e.checkOracle("qd", "public.b", "id")
	e.checkOracle("qd", "public.a", "id")
}

// TestRecreatedTableRejoins: a configured table dropped and created again under its name while
// pg_cdc streams is in none of its publications, so PostgreSQL sends none of the new table's
// changes; the next heartbeat tick ends the session with a publication error naming the drop, and
// the next start puts the new table in the managed publication and reads it (`snapshot: initial`):
// rows inserted before that start arrive as r events, later ones as changes, and the queue's last
// state of every key the new table holds equals it.
func TestRecreatedTableRejoins(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY, v text)`)
	e.run("recr", `[{table: a, queue: qr}, {table: b, queue: qr}]`, "heartbeat: 1s\nsnapshot: initial")
	e.waitStatus("qr", "recr", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 'one')`)
	e.waitEntries("qr", 2)
	e.pg.Exec(`DROP TABLE b; CREATE TABLE b (id int PRIMARY KEY, v text)`)
	e.pg.Exec(`INSERT INTO b VALUES (2, 'two'), (3, 'three')`) // before the new table is published: read, not sent
	e.waitStatus("qr", "recr", `table public.b was dropped and created again while it was streamed`)
	e.waitStatus("qr", "recr", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO b VALUES (4, 'four'); UPDATE b SET v = 'changed' WHERE id = 2`)
	e.waitReadAgain("qr", `"v":"changed"`)
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "qr")
	if err != nil {
		t.Fatal(err)
	}
	res := oracle.Replay(entries)
	rows, err := oracle.TableRows(e.ctx, e.conn(), "public.b", []string{"id"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Problems {
		t.Error(p)
	}
	replayed := map[string]oracle.Row{} // the dropped table's row 1 got no d: only the new table's keys
	for k := range rows {
		if r, ok := res.Tables["public.b"][k]; ok {
			replayed[k] = r
		}
	}
	for _, d := range oracle.Compare(replayed, rows) {
		t.Error(d)
	}
}

// TestTableReadAgainAfterAStartKilledOnceItWasBack: the start that finds a table out of the
// publication and puts it back stops before its first write (here: it waits for a slot another
// process holds, and is stopped there); the next start finds the table in the publication, yet
// reads it again, because the first start recorded it before it changed the publication.
func TestTableReadAgainAfterAStartKilledOnceItWasBack(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY, v text);
		CREATE PUBLICATION holder FOR TABLE a`) // the holder's: it must exist at the WAL it decodes
	stop := e.run("cw", `[{table: a, queue: qw}, {table: b, queue: qw}]`, "snapshot: initial")
	e.waitStatus("qw", "cw", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 'one')`)
	e.waitEntries("qw", 2)
	stop()
	e.pg.Exec(`ALTER PUBLICATION pgrelay_cw DROP TABLE b`)
	e.pg.Exec(`INSERT INTO b VALUES (2, 'two')`) // while b is out: never sent
	e.pg.Exec(`UPDATE b SET v = 'changed' WHERE id = 1`)

	cfg, _ := pgconn.ParseConfig(e.pg.DSN() + "&replication=database")
	holder, err := pgconn.ConnectConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(e.ctx)
	cdctest.Wait(t, 30*time.Second, "the slot free for the holder", func() (bool, string) {
		err := pglogrepl.StartReplication(e.ctx, holder, "pgrelay_cw", 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'holder'"}})
		return err == nil, fmt.Sprint(err)
	})
	stop = e.run("cw", `[{table: a, queue: qw}, {table: b, queue: qw}]`, "snapshot: initial")
	e.waitStatus("qw", "cw", `"phase":"waiting_for_slot"`)
	var n int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'pgrelay_cw' AND tablename = 'b'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("b not put back in the publication: %d %v", n, err)
	}
	stop()
	holder.Close(e.ctx)

	e.run("cw", `[{table: a, queue: qw}, {table: b, queue: qw}]`, "snapshot: initial")
	e.waitStatus("qw", "cw", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO b VALUES (3, 'three')`)
	e.waitReadAgain("qw", `"v":"three"`)
	e.checkOracle("qw", "public.b", "id")
}

// TestTableReadAgainOnceAnUnmanagedPublicationIsFixed: with `publication.manage: false`, a start
// that finds a streamed table out of the publication is refused (publication) until the
// administrator puts it back; the start after that reads the table again.
func TestTableReadAgainOnceAnUnmanagedPublicationIsFixed(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY, v text);
		CREATE PUBLICATION upub FOR TABLE a, b`)
	extra := "snapshot: initial\npublication: {name: upub, manage: false}"
	stop := e.run("um", `[{table: a, queue: qu}, {table: b, queue: qu}]`, extra)
	e.waitStatus("qu", "um", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 'one')`)
	e.waitEntries("qu", 2)
	stop()
	e.pg.Exec(`ALTER PUBLICATION upub DROP TABLE b`)
	e.pg.Exec(`INSERT INTO b VALUES (2, 'two')`) // while b is out: never sent
	e.run("um", `[{table: a, queue: qu}, {table: b, queue: qu}]`, extra)
	e.waitStatus("qu", "um", `"code":"publication"`)
	e.pg.Exec(`ALTER PUBLICATION upub ADD TABLE b`)
	e.waitStatus("qu", "um", `"phase":"streaming"`)
	e.waitReadAgain("qu", "")
	e.checkOracle("qu", "public.b", "id")
}

// waitReadAgain waits until queue holds public.b's two rows read again (as r events) and, unless
// after is "", an entry containing after (a change made once the table was back).
func (e *env) waitReadAgain(queue, after string) {
	e.t.Helper()
	cdctest.Wait(e.t, 30*time.Second, "public.b read again", func() (bool, string) {
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", queue)
		if err != nil {
			e.t.Fatal(err)
		}
		reread, seen := 0, after == ""
		for _, en := range entries {
			p := string(en.Payload)
			reread += strings.Count(p, `"op":"r","table":"public.b"`)
			seen = seen || strings.Contains(p, after)
		}
		return reread >= 2 && seen, fmt.Sprintf("%d entries, %d rows of b read again", len(entries), reread)
	})
}
