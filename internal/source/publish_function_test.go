package source_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// publishExists reports whether pgrelay.publish(text,text,jsonb) exists, asking as the superuser.
func (e *env) publishExists() bool {
	e.t.Helper()
	var ok bool
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT to_regprocedure('pgrelay.publish(text,text,jsonb)') IS NOT NULL`).Scan(&ok); err != nil {
		e.t.Fatalf("look up pgrelay.publish: %v", err)
	}
	return ok
}

// schemaExists reports whether the pgrelay schema exists.
func (e *env) schemaExists() bool {
	e.t.Helper()
	var ok bool
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgrelay')`).Scan(&ok); err != nil {
		e.t.Fatalf("look up schema pgrelay: %v", err)
	}
	return ok
}

// TestPublishFunctionInstalledAtStart proves that with the default config pg_cdc installs
// pgrelay.publish() on a database that lacks it, and that the installed function works end to end:
// a message published inside a transaction with a row insert arrives in the queue as an `m` event
// of that same transaction (same tx id and commit lsn as the row's `c`).
func TestPublishFunctionInstalledAtStart(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	if e.publishExists() {
		t.Fatal("a fresh database already has pgrelay.publish")
	}
	e.run("pubfn", `[{table: s, queue: q}]`, "")
	e.waitPointer("pubfn", "q") // the install runs before the first pointer is written
	if !e.publishExists() {
		t.Fatal("pgrelay.publish(text,text,jsonb) not installed at start")
	}
	e.pg.Exec(`BEGIN; INSERT INTO s VALUES (1); SELECT pgrelay.publish('q', 'p', '{"a":1}'); COMMIT`)
	entries := e.waitEntries("q", 2)
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2", len(entries))
	}
	var row, msg oracle.Entry
	for _, en := range entries {
		if en.Partition == "p" {
			msg = en
		} else {
			row = en
		}
	}
	ev, rowEv := event(t, msg), event(t, row)
	if string(ev["op"]) != `"m"` || string(ev["after"]) != `{"a": 1}` || string(rowEv["op"]) != `"c"` {
		t.Fatalf("message %s, row %s", msg.Payload, row.Payload)
	}
	if msg.Tx == "" || msg.Tx != row.Tx || string(ev["lsn"]) != string(rowEv["lsn"]) {
		t.Errorf("message not in the row's transaction: message tx %q lsn %s, row tx %q lsn %s", msg.Tx, ev["lsn"], row.Tx, rowEv["lsn"])
	}
}

// TestPublishFunctionExistingIsLeftAlone proves an existing pgrelay.publish(text,text,jsonb) is never
// replaced: its body, owner and oid are the same after pg_cdc started.
func TestPublishFunctionExistingIsLeftAlone(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY);
		CREATE ROLE fnowner;
		CREATE SCHEMA pgrelay AUTHORIZATION fnowner;
		CREATE FUNCTION pgrelay.publish(queue text, partition text, payload jsonb) RETURNS pg_lsn
			LANGUAGE sql AS $$ SELECT '0/1'::pg_lsn /* theirs */ $$;
		ALTER FUNCTION pgrelay.publish(text, text, jsonb) OWNER TO fnowner`)
	read := func() string {
		var s string
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT oid::text || ' ' || proowner::regrole::text || ' ' || prosrc
			FROM pg_proc WHERE oid = to_regprocedure('pgrelay.publish(text,text,jsonb)')`).Scan(&s); err != nil {
			t.Fatalf("read pgrelay.publish: %v", err)
		}
		return s
	}
	before := read()
	e.run("keep", `[{table: s, queue: q}]`, "")
	e.waitPointer("keep", "q")
	if after := read(); after != before || !strings.Contains(after, "theirs") {
		t.Errorf("existing function changed: %q, was %q", after, before)
	}
}

// TestPublishFunctionFalseInstallsNothing proves publish_function: false leaves the database alone:
// no function and no pgrelay schema once the source streams.
func TestPublishFunctionFalseInstallsNothing(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	e.run("nofn", `[{table: s, queue: q}]`, "publish_function: false")
	e.waitPointer("nofn", "q")
	e.waitStatus("q", "nofn", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO s VALUES (1)`)
	e.waitEntries("q", 1)
	if e.publishExists() || e.schemaExists() {
		t.Errorf("publish_function: false installed something: function %v, schema %v", e.publishExists(), e.schemaExists())
	}
}

// startLoggedStream runs a pipeline like startStream, its warnings and errors going to the returned buffer.
func startLoggedStream(tb testing.TB, yaml string) (*testenv.SyncBuffer, func()) {
	logs := &testenv.SyncBuffer{}
	return logs, runStream(tb, yaml, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// TestPublishFunctionWithoutPrivilegeWarnsAndStreams runs pg_cdc as a role with LOGIN REPLICATION and
// SELECT on the table but no CREATE on the database, over a publication the superuser created
// (manage: false): the install is refused (42501), yet the source streams every row, nothing was
// created, and exactly one warning with code publish_function and its fix is logged.
func TestPublishFunctionWithoutPrivilegeWarnsAndStreams(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY);
		CREATE ROLE cdc LOGIN REPLICATION;
		GRANT SELECT ON s TO cdc;
		CREATE PUBLICATION cdc_pub FOR TABLE s`)
	var canCreate bool
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT has_database_privilege('cdc', current_database(), 'CREATE')`).Scan(&canCreate); err != nil || canCreate {
		t.Fatalf("role cdc must lack CREATE on the database: %v %v", canCreate, err)
	}
	dsn := strings.Replace(e.pg.DSN(), "postgres@", "cdc@", 1)
	yaml := fmt.Sprintf(`
input:
  pg_cdc:
    name: noperm
    dsn: %s
    tls: {mode: disable}
    tables: [{table: s, queue: q}]
    publication: {name: cdc_pub, manage: false}
    redis: {url: %s}
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue:
    url: %s
`, dsn, e.rd.URL(), e.rd.URL())
	logs, _ := startLoggedStream(t, yaml)
	e.waitPointer("noperm", "q")
	e.waitStatus("q", "noperm", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO s SELECT generate_series(1, 3)`)
	e.waitEntries("q", 3)
	e.checkOracle("q", "public.s", "id")
	if e.publishExists() || e.schemaExists() {
		t.Errorf("installed without the privilege: function %v, schema %v", e.publishExists(), e.schemaExists())
	}
	out := logs.String()
	if n := strings.Count(out, "publish_function: not allowed to install"); n != 1 {
		t.Errorf("%d publish_function warnings, want 1; log:\n%s", n, out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "Fix: run resources/source_publish.sql as a role with CREATE on the database, or set publish_function: false") {
		t.Errorf("warning without its level or fix; log:\n%s", out)
	}
}
