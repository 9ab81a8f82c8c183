package source_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/source"
)

// minimalSourceGrants are the privileges of a pg_cdc role with nothing to spare, on a server where
// PUBLIC may neither connect nor emit logical messages (so each one is granted explicitly): the
// publication is the administrator's (publication.manage: false), and the role has no CREATE on the
// database or a schema and owns nothing. emit is pg_logical_emit_message's signature: its text
// variant gained a flush argument in PostgreSQL 17.
func minimalSourceGrants(emit string) []string {
	return []string{
		`GRANT CONNECT ON DATABASE postgres TO %s`,
		`GRANT USAGE ON SCHEMA app TO %s`,
		`GRANT SELECT ON app.s TO %s`,
		`GRANT EXECUTE ON FUNCTION ` + emit + ` TO %s`,
	}
}

// runAs starts pg_cdc of app.s into queue q<name> as role, with the pre-created publication and
// `snapshot: initial`.
func (e *env) runAs(name, role string) func() {
	e.t.Helper()
	return startStream(e.t, fmt.Sprintf(`
input:
  pg_cdc:
    name: %s
    dsn: %s
    tables: [{table: app.s, queue: q%[1]s}]
    publication: {name: app_pub, manage: false}
    snapshot: initial
    redis: {url: %[3]s}
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue:
    url: %[3]s
logger:
  level: warn
`, name, e.pg.UserDSN(role, "postgres"), e.rd.URL()))
}

// replicaStatus is the source's status entry that shows want (a phase, or an error code of the
// session or of a refused table), waiting up to 30 s; it returns the entry's error text.
func (e *env) statusError(queue, name string, want func(source.ReplicaStatus) (string, bool)) string {
	e.t.Helper()
	var text string
	cdctest.WaitEvery(e.t, 30*time.Second, 100*time.Millisecond, "the awaited status of source "+name, func() (bool, string) {
		st, _ := e.rd.Client().HGetAll(e.ctx, "pgrelay:{"+queue+"}:src:"+name+":status").Result()
		for _, v := range st {
			var rs source.ReplicaStatus
			if json.Unmarshal([]byte(v), &rs) == nil {
				var ok bool
				if text, ok = want(rs); ok {
					return true, ""
				}
			}
		}
		return false, fmt.Sprint(st)
	})
	return text
}

// TestLeastPrivilegeSource runs pg_cdc as a role with only LOGIN REPLICATION, CONNECT, USAGE on the
// table's schema, SELECT on the table and EXECUTE on pg_logical_emit_message (PUBLIC has neither
// CONNECT nor that EXECUTE here), with a publication created beforehand by the administrator and
// `snapshot: initial`: the snapshot and the stream reach the queue, which replays to the table. Then,
// for each privilege of that set, a role lacking only it is refused with its code and a fix naming
// the statement that grants it; once that statement has run, the same source streams.
func TestLeastPrivilegeSource(t *testing.T) {
	e := newEnv(t)
	emit := "pg_catalog.pg_logical_emit_message(boolean,text,text)"
	if e.pg.Version >= 17 {
		emit = "pg_catalog.pg_logical_emit_message(boolean,text,text,boolean)"
	}
	e.pg.Exec(`REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
		REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		REVOKE EXECUTE ON FUNCTION ` + emit + ` FROM PUBLIC;
		CREATE SCHEMA app;
		CREATE TABLE app.s (id int PRIMARY KEY, v text);
		INSERT INTO app.s SELECT g, 'v' || g FROM generate_series(1, 100) g;
		CREATE PUBLICATION app_pub FOR TABLE app.s`)
	minimal := minimalSourceGrants(emit)
	e.pg.CreateRole("cdc", "LOGIN REPLICATION", minimal...)
	cases := []struct {
		role, attributes, without string // without: the grant left out
		code                      errcode.Code
		fix                       string // the statement the error names, run to fix it
	}{
		{"no_login", "REPLICATION", "", errcode.PGLogin, `ALTER ROLE "no_login" LOGIN`},
		{"no_connect", "LOGIN REPLICATION", "CONNECT", errcode.PGLogin, `GRANT CONNECT ON DATABASE "postgres" TO "no_connect"`},
		{"no_replication", "LOGIN", "", errcode.SourcePrivileges, `ALTER ROLE "no_replication" REPLICATION`},
		{"no_usage", "LOGIN REPLICATION", "USAGE", errcode.SourcePrivileges, `GRANT USAGE ON SCHEMA "app" TO "no_usage"`},
		{"no_select", "LOGIN REPLICATION", "SELECT", errcode.SourcePrivileges, `GRANT SELECT ON "app"."s" TO "no_select"`},
		{"no_emit", "LOGIN REPLICATION", "EXECUTE", errcode.SourcePrivileges, `GRANT EXECUTE ON FUNCTION ` + emit + ` TO "no_emit"`},
	}
	for _, c := range cases {
		var grants []string
		for _, g := range minimal {
			if c.without == "" || !strings.Contains(g, c.without) {
				grants = append(grants, g)
			}
		}
		e.pg.CreateRole(c.role, c.attributes, grants...)
	}

	// The minimal role: snapshot, then inserts, updates and deletes, all in the queue.
	e.runAs("min", "cdc")
	e.statusError("qmin", "min", func(rs source.ReplicaStatus) (string, bool) { return "", rs.Phase == source.PhaseStreaming })
	e.pg.Exec(`INSERT INTO app.s VALUES (101, 'new'); UPDATE app.s SET v = 'changed' WHERE id <= 10; DELETE FROM app.s WHERE id > 90 AND id <= 100`)
	e.waitEntries("qmin", 100+1+10+10)
	e.checkOracle("qmin", "app.s", "id")

	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := strings.ReplaceAll(c.role, "_", "")
			e.runAs(name, c.role)
			text := e.statusError("q"+name, name, func(rs source.ReplicaStatus) (string, bool) {
				for _, r := range rs.Refused {
					if r.Code == c.code {
						return r.Error, true
					}
				}
				return rs.Error, rs.Code == c.code
			})
			if !strings.Contains(text, "Fix: "+c.fix) {
				t.Errorf("%s: %s, want the fix %q", c.role, text, c.fix)
				return
			}
			e.pg.Exec(c.fix)
			e.statusError("q"+name, name, func(rs source.ReplicaStatus) (string, bool) { return "", rs.Phase == source.PhaseStreaming })
		}()
	}
	wg.Wait()
}
