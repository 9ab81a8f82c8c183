package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestCheckRunsEveryStartCheckAndChangesNothing runs `pgrelay check` on the two pipelines of a
// round trip (pg_cdc → redis_queue, redis_queue → pg_sink): against servers that are ready it
// passes, exit status 0, every line ok; with a missing table, a Redis user missing a command, a
// missing sink target and a Redis without AOF under `durability: aof`, it exits 1 naming each
// failure by its code (text and --json); a role that may not create the managed publication
// fails on it (its statements tried in a transaction rolled back), a sink into a read-only
// database is pg_read_only; in sql mode a statement PostgreSQL cannot prepare is sql_statement, and
// a cdc sink's `schema.*` target in a missing schema is target_missing. No run leaves anything
// behind: no publication, slot or progress table in PostgreSQL, no key in Redis.
func TestCheckRunsEveryStartCheckAndChangesNothing(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	rd := testenv.StartRedis(t)
	noAOF := testenv.StartRedis(t, "--appendonly", "no")
	pg.Exec(`CREATE TABLE orders (id int PRIMARY KEY, v text); CREATE TABLE orders_copy (id int PRIMARY KEY, v text)`)
	rd.ACL("ACL SETUSER noxadd reset on >pw ~pgrelay:* +@all -xadd")
	pipelines := func(table, target, sourceRedis, outputRedis string) string {
		source := writeConfig(t, "source.yaml", fmt.Sprintf(`input:
  pg_cdc:
    name: shop
    dsn: %s
    tables: [{table: %s, queue: shop}]
    redis: {url: %q}
output:
  redis_queue: {url: %q, durability: aof}
`, pg.DSN(), table, sourceRedis, outputRedis))
		sink := writeConfig(t, "sink.yaml", fmt.Sprintf(`input:
  redis_queue: {url: %q, queue: shop, group: copy}
output:
  pg_sink: {name: copy, dsn: %q, table: %s, mode: cdc}
`, rd.URL(), pg.DSN(), target))
		return source + "\n" + sink
	}
	check := func(configs string, args ...string) (out string, code int) {
		for _, cfg := range strings.Split(configs, "\n") {
			o, c := runCheck(t, nil, cfg, args...)
			out, code = out+o, max(code, c)
		}
		return out, code
	}

	out, code := check(pipelines("orders", "orders_copy", rd.URL(), rd.URL()))
	if code != 0 || strings.Contains(out, "FAIL") || strings.Count(out, "  ok  ") < 8 {
		t.Fatalf("ready servers: exit %d\n%s", code, out)
	}
	for _, want := range []string{"table public.orders", "the replication connection", "pg_sink copy (cdc)", "is created at start"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}

	broken := pipelines("nosuch", "nosuch_copy", rd.UserURL("noxadd", "pw"), noAOF.URL())
	out, code = check(broken)
	if code != 1 {
		t.Errorf("broken servers: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{"FAIL  table public.nosuch: tables[0] (public.nosuch): table_missing:", "redis_acl:", "ACL SETUSER noxadd +xadd",
		"durability_aof:", "target_missing:"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	jsonOut, _ := check(strings.Split(broken, "\n")[1], "--json")
	var results []struct {
		Component, Check, Code string
		OK                     bool
	}
	if err := json.Unmarshal([]byte(jsonOut), &results); err != nil {
		t.Fatalf("--json: %v\n%s", err, jsonOut)
	}
	var codes []string
	for _, r := range results {
		if !r.OK {
			codes = append(codes, r.Code)
		}
	}
	if strings.Join(codes, ",") != "target_missing" {
		t.Errorf("--json of the sink pipeline: failed codes %v\n%s", codes, jsonOut)
	}

	// a role that may read the table and replicate but not create the managed publication (no
	// CREATE on the database, not the table's owner): the statements are tried and rolled back
	pg.CreateRole("reader", "LOGIN REPLICATION", `GRANT SELECT ON orders TO %s`)
	reader := writeConfig(t, "reader.yaml", fmt.Sprintf(`input:
  pg_cdc:
    name: reader
    dsn: %s
    tables: [{table: orders, queue: shop}]
    redis: {url: %q}
output:
  drop: {}
`, pg.UserDSN("reader", "postgres"), rd.URL()))
	if out, code := runCheck(t, nil, reader); code != 1 || !strings.Contains(out, "FAIL  publications pgrelay_reader (managed") ||
		!strings.Contains(out, "publication: not allowed to create or alter publication pgrelay_reader") {
		t.Errorf("a role that may not create the publication: exit %d\n%s", code, out)
	}

	// a sink whose database takes no writes
	pg.CreateDatabase("ro")
	pg.Exec(`ALTER DATABASE ro SET default_transaction_read_only = on`)
	roSink := writeConfig(t, "ro.yaml", fmt.Sprintf(`input:
  redis_queue: {url: %q, queue: shop, group: ro}
output:
  pg_sink: {name: ro, dsn: %q, table: orders_copy, mode: upsert}
`, rd.URL(), pg.DatabaseDSN("ro")))
	if out, code := runCheck(t, nil, roSink); code != 1 || !strings.Contains(out, "pg_read_only:") {
		t.Errorf("a sink into a read-only database: exit %d\n%s", code, out)
	}

	// sql mode: the statements are prepared, so a typo is found before any message is read
	sqlSink := func(statement string) string {
		return writeConfig(t, "sql.yaml", fmt.Sprintf(`input:
  redis_queue: {url: %q, queue: shop, group: sql}
output:
  pg_sink: {name: sql, dsn: %q, mode: sql, statement: %q, params: [$.id]}
`, rd.URL(), pg.DSN(), statement))
	}
	if out, code := check(sqlSink(`UPDATE orders SET v = 'x' WHERE id = $1::int`)); code != 0 || !strings.Contains(out, "ok    PostgreSQL: the progress table, the statements") {
		t.Errorf("sql mode, a good statement: exit %d\n%s", code, out)
	}
	if out, code := check(sqlSink(`UPDATE ordres SET v = 'x' WHERE id = $1::int`)); code != 1 || !strings.Contains(out, "sql_statement:") {
		t.Errorf("sql mode, a typo: exit %d\n%s", code, out)
	}

	// cdc with tables: the schema of a schema.* target is checked, its tables come with their events
	tablesSink := func(target string) string {
		return writeConfig(t, "tables.yaml", fmt.Sprintf(`input:
  redis_queue: {url: %q, queue: shop, group: tables}
output:
  pg_sink: {name: tables, dsn: %q, mode: cdc, tables: {"public.*": %q}}
`, rd.URL(), pg.DSN(), target))
	}
	if out, code := check(tablesSink("public.*")); code != 0 {
		t.Errorf("tables into an existing schema: exit %d\n%s", code, out)
	}
	if out, code := check(tablesSink("copy.*")); code != 1 || !strings.Contains(out, `target_missing: schema copy of tables entry "public.*" does not exist`) {
		t.Errorf("tables into a missing schema: exit %d\n%s", code, out)
	}

	var pubs, slots, progress int
	ctx := context.Background()
	pg.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots),
		(SELECT count(*) FROM pg_class WHERE relname = 'sink_progress')`).Scan(&pubs, &slots, &progress)
	keys := rd.Client().Keys(ctx, "*").Val()
	if pubs+slots+progress != 0 || len(keys) != 0 {
		t.Errorf("check left %d publications, %d slots, %d progress tables, Redis keys %v", pubs, slots, progress, keys)
	}
}

// runCheck runs `pgrelay check -c config` with env added and returns its output and exit status.
func runCheck(t testing.TB, env []string, config string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testenv.Binary(t), append([]string{"check", "-c", config}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}
