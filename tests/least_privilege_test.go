package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// lpEnv is a deployment with nothing to spare: PostgreSQL roles holding only what pg_cdc and pg_sink
// need, and one Redis ACL user per role with exactly its line of docs/operations.md.
type lpEnv struct {
	t      *testing.T
	ctx    context.Context
	pg     *testenv.Postgres
	rd     *testenv.Redis
	b      *pgxpool.Pool // the sink's database, as the superuser
	dir    string
	source string // config of pg_cdc → redis_queue as pgrelay-source
	sink   string // config of redis_queue → pg_sink as pgrelay-consumer
}

const lpPassword = "lp-secret"

// lpUsers are the Redis users of docs/operations.md's Least privilege section.
var lpUsers = map[string][]redisconn.Use{
	"pgrelay-source":   redisconn.SourceUses,
	"pgrelay-consumer": redisconn.ConsumerUses,
	"pgrelay-cli":      redisconn.CLIReadUses,
	"pgrelay-operator": redisconn.CLIWriteUses,
}

func newLPEnv(t *testing.T) *lpEnv {
	e := &lpEnv{t: t, ctx: context.Background(), pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t), dir: t.TempDir()}
	// The source database: the administrator owns the table and the publication.
	e.pg.Exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		CREATE TABLE rt (id int PRIMARY KEY, v text);
		INSERT INTO rt SELECT g, 'v' || g FROM generate_series(1, 200) g;
		CREATE PUBLICATION lp_pub FOR TABLE rt`)
	e.pg.CreateRole("pgrelay_cdc", "LOGIN REPLICATION", `GRANT SELECT ON public.rt TO %s`)
	// The sink database: the administrator creates the target and the progress table.
	dsnB := e.pg.CreateDatabase("b")
	var err error
	if e.b, err = pgxpool.New(e.ctx, dsnB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.b.Close)
	e.pg.CreateRole("pgrelay_sink", "LOGIN")
	prog, err := sink.NewProgress("lp", sink.DefaultProgressTable)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Exec(e.ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		CREATE TABLE rt (id int PRIMARY KEY, v text CHECK (v <> 'poison'));
		GRANT INSERT, UPDATE, SELECT, DELETE ON rt TO pgrelay_sink;
		`+prog.AdminSQL("pgrelay_sink")); err != nil {
		t.Fatal(err)
	}
	for user, uses := range lpUsers {
		e.rd.ACL(redisconn.ACLLine(user, lpPassword, "pgrelay", uses...))
	}
	e.source = e.write("source.yaml", e.sourceConfig("pgrelay-source"))
	e.sink = e.write("sink.yaml", fmt.Sprintf(`
http: {enabled: false}
logger: {level: info}
input:
  redis_queue:
    url: %s
    queue: q
    group: g
    start_from: earliest
    lease_ttl: 3s
    max_attempts: 2
output:
  pg_sink:
    dsn: %q
    name: lp
    table: public.rt
    mode: cdc
    create_progress_table: false
`, e.rd.UserURL("pgrelay-consumer", lpPassword), e.pg.UserDSN("pgrelay_sink", "b")))
	return e
}

// sourceConfig is pg_cdc → redis_queue as Redis user user, with every durability and retention
// check its ACL line covers (aof, a length bound that trims nothing).
func (e *lpEnv) sourceConfig(user string) string {
	url := e.rd.UserURL(user, lpPassword)
	return fmt.Sprintf(`
http: {enabled: false}
logger: {level: info}
input:
  pg_cdc:
    name: lp
    dsn: %s
    tables: [{table: rt, queue: q}]
    publication: {name: lp_pub, manage: false}
    publish_function: false
    snapshot: initial
    redis: {url: %s}
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue:
    url: %s
    durability: aof
    max_length: 1000000
    trim_interval: 1s
shutdown_timeout: 10s
`, e.pg.UserDSN("pgrelay_cdc", "postgres"), url, url)
}

func (e *lpEnv) write(name, body string) string {
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// cli runs pgrelay with args; it returns the output and whether it exited 0.
func (e *lpEnv) cli(args ...string) (string, bool) {
	out, err := exec.Command(testenv.Binary(e.t), args...).CombinedOutput()
	return string(out), err == nil
}

// waitCopy waits until rt of B is rt of A without the poison rows, the group has acked everything
// and the dead-letter stream holds dead letters.
func (e *lpEnv) waitCopy(deadLetters int64, procs ...*testenv.Process) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	state := ""
	for time.Now().Before(deadline) {
		want, err1 := tableHashes(e.ctx, e.pg.Pool(), "rt", "id")
		got, err2 := tableHashes(e.ctx, e.b, "rt", "id")
		info, err3 := queue.Inspect(e.ctx, e.rd.Client(), queue.NewLayout("pgrelay"), "q")
		if err1 == nil && err2 == nil && err3 == nil {
			for id := range want {
				if id >= 1000 { // the poison rows never land
					delete(want, id)
				}
			}
			d := hashDiff(want, got)
			lag := int64(0)
			for _, g := range info.Groups {
				lag += g.Lag + g.Pending
			}
			if len(d) == 0 && lag == 0 && info.DeadLetters == deadLetters {
				return
			}
			state = fmt.Sprintf("differences %v, lag+pending %d, dead letters %d", d, lag, info.DeadLetters)
		} else {
			state = fmt.Sprint(err1, err2, err3)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range procs {
		e.t.Logf("output: %s", sinkLastLines(p.Output(), 10))
	}
	e.t.Fatalf("the copy never caught up: %s", state)
}

// aclDenials are the ACL LOG entries of pgrelay's users: every command or key Redis refused them.
func (e *lpEnv) aclDenials() []string {
	entries, err := e.rd.Client().Do(e.ctx, "ACL", "LOG").Slice()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		m, _ := en.(map[any]any)
		out = append(out, fmt.Sprintf("%v %v %v", m["username"], m["reason"], m["object"]))
	}
	return out
}

// TestLeastPrivilegeEndToEnd deploys pgrelay as docs/operations.md (Least privilege) says: pg_cdc as
// a role with LOGIN REPLICATION and SELECT on its table and a publication the administrator made,
// pg_sink as a role with the cdc mode's DML on its target and the administrator's progress table,
// and four Redis users each holding exactly its ACL line. The snapshot and the stream reach the
// copy, a poison row is dead-lettered, Redis refused nothing (ACL LOG is empty), the read-only CLI
// user reads status, queue info, position and dead letters but is refused dlq --drop and resync with
// redis_acl naming the rule, and the operator user replays and drops dead letters and resyncs.
// Then each pipeline's start check reports a command taken from its user (redis_acl naming the
// rule) and the pipeline carries on once the rule is back.
func TestLeastPrivilegeEndToEnd(t *testing.T) {
	e := newLPEnv(t)
	src := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.source)
	snk := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.sink)
	e.pg.Exec(`INSERT INTO rt VALUES (201, 'new'), (1000, 'poison'); UPDATE rt SET v = 'changed' WHERE id <= 20; DELETE FROM rt WHERE id > 190 AND id <= 200`)
	e.waitCopy(1, src, snk)
	if d := e.aclDenials(); len(d) > 0 {
		t.Fatalf("Redis refused pgrelay's users: %v", d)
	}

	// The read-only CLI user.
	cliURL, opURL := e.rd.UserURL("pgrelay-cli", lpPassword), e.rd.UserURL("pgrelay-operator", lpPassword)
	cliConf := e.write("cli.yaml", e.sourceConfig("pgrelay-cli"))
	opConf := e.write("operator.yaml", e.sourceConfig("pgrelay-operator"))
	for _, args := range [][]string{
		{"status", "-c", cliConf},
		{"queue", "info", "--url", cliURL, "q"},
		{"queue", "position", "--url", cliURL, "q"},
		{"queue", "dlq", "--url", cliURL, "q"},
	} {
		out, ok := e.cli(args...)
		if !ok || strings.Contains(out, "redis_acl") {
			t.Errorf("pgrelay %s as pgrelay-cli: %s", strings.Join(args, " "), out)
		}
	}
	for _, c := range []struct {
		args []string
		fix  string
	}{
		{[]string{"queue", "dlq", "--drop", "--url", cliURL, "q"}, "ACL SETUSER pgrelay-cli +xdel"},
		{[]string{"queue", "dlq", "--replay", "--url", cliURL, "q"}, "ACL SETUSER pgrelay-cli +"},
		{[]string{"resync", "-c", cliConf}, "ACL SETUSER pgrelay-cli +set"},
	} {
		if out, ok := e.cli(c.args...); ok || !strings.Contains(out, "redis_acl") || !strings.Contains(out, "Fix: "+c.fix) {
			t.Errorf("pgrelay %s as pgrelay-cli: %s, want redis_acl with the fix %q", strings.Join(c.args, " "), out, c.fix)
		}
	}

	e.rd.ACL("ACL LOG RESET") // those refusals were the point

	// The operator: replay (dead-lettered again), drop, resync (a new epoch, the copy still equal).
	if out, ok := e.cli("queue", "dlq", "--replay", "--url", opURL, "q"); !ok || !strings.Contains(out, "replayed 1") {
		t.Fatalf("replay as pgrelay-operator: %s", out)
	}
	e.waitCopy(1, src, snk)
	if out, ok := e.cli("queue", "dlq", "--drop", "--url", opURL, "q"); !ok || !strings.Contains(out, "dropped 1") {
		t.Fatalf("drop as pgrelay-operator: %s", out)
	}
	e.pg.Exec(`DELETE FROM rt WHERE id = 1000`) // else the resync's snapshot dead-letters it again
	if out, ok := e.cli("resync", "-c", opConf); !ok {
		t.Fatalf("resync as pgrelay-operator: %s", out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		raw, _ := e.rd.Client().Get(e.ctx, "pgrelay:{q}:src:lp:ptr").Bytes()
		if p, err := pointer.Parse(raw); err == nil && p.Gen == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no resync: pointer %s; output: %s", raw, sinkLastLines(src.Output(), 10))
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.pg.Exec(`INSERT INTO rt VALUES (202, 'after resync')`)
	e.waitCopy(0, src, snk)
	if d := e.aclDenials(); len(d) > 0 {
		t.Fatalf("Redis refused pgrelay's users: %v", d)
	}
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil || len(entries) == 0 {
		t.Fatalf("queue: %d entries, %v", len(entries), err)
	}

	// Each pipeline's start check: a command taken away is named, and the pipeline carries on
	// once it is back.
	src.Kill()
	snk.Kill()
	for _, c := range []struct {
		user, cmd, config string
	}{
		{"pgrelay-source", "xadd", e.source},
		{"pgrelay-consumer", "xreadgroup", e.sink},
	} {
		e.rd.ACL("ACL SETUSER " + c.user + " -" + c.cmd)
		p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", c.config)
		fix := "ACL SETUSER " + c.user + " +" + c.cmd
		waitOutput(t, p, "redis_acl", fix)
		e.rd.ACL(fix)
		if c.user == "pgrelay-source" {
			src = p
		} else {
			snk = p
		}
	}
	e.pg.Exec(`INSERT INTO rt VALUES (203, 'after the fix')`)
	e.waitCopy(0, src, snk)
}

// waitOutput waits until the process printed a line holding every one of parts.
func waitOutput(t *testing.T, p *testenv.Process, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(p.Output(), "\n") {
			all := true
			for _, s := range parts {
				all = all && strings.Contains(line, s)
			}
			if all {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no line with %q in: %s", parts, sinkLastLines(p.Output(), 10))
}
