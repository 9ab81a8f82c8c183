package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
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
	// autofix are processes whose redis_acl fixes waitCopy runs as they print them.
	autofix []*testenv.Process
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
	e.sink = e.write("sink.yaml", e.sinkConfig("pgrelay-consumer"))
	return e
}

// sinkConfig is redis_queue → pg_sink (cdc) as Redis user user.
func (e *lpEnv) sinkConfig(user string) string {
	return fmt.Sprintf(`
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
`, e.rd.UserURL(user, lpPassword), e.pg.UserDSN("pgrelay_sink", "b"))
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
		for _, p := range e.autofix {
			e.applyFixes(p.Output())
		}
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
// Then every pipeline and CLI command runs as a user holding only its keys: each permission it
// lacks is named by redis_acl with the rule, it works once the rules ran, and the rules it took add
// up to its documented line; a rule taken from a running pipeline is named too.
func TestLeastPrivilegeEndToEnd(t *testing.T) {
	e := newLPEnv(t)
	src := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.source)
	snk := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.sink)
	e.pg.Exec(`INSERT INTO rt VALUES (201, 'new'), (1000, 'poison'); UPDATE rt SET v = 'changed' WHERE id <= 20; DELETE FROM rt WHERE id > 190 AND id <= 200`)
	e.waitCopy(1, src, snk)
	if d := e.aclDenials(); len(d) > 0 {
		t.Fatalf("Redis refused pgrelay's users: %v", d)
	}
	// The preflight passes as the components' own least-privilege role and users.
	for _, conf := range []string{e.source, e.sink} {
		if out, ok := e.cli("check", "-c", conf); !ok || strings.Contains(out, "FAIL") {
			t.Errorf("pgrelay check -c %s as the least-privilege role and users:\n%s", conf, out)
		}
	}
	if d := e.aclDenials(); len(d) > 0 {
		t.Fatalf("Redis refused pgrelay check: %v", d)
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

	// Each pipeline's start check, for a user holding only its keys (and MULTI, DISCARD, which the
	// check itself needs): the pipeline names what it lacks and carries on once that ran; what it
	// took is exactly its documented line (the source's without WAIT, which only durability:
	// {replicas: N} runs).
	src.Kill()
	snk.Kill()
	e.bareUser("lp-source", "+multi +discard")
	e.bareUser("lp-consumer", "+multi +discard")
	src = testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.write("lp-source.yaml", e.sourceConfig("lp-source")))
	snk = testenv.StartProcess(t, nil, testenv.Binary(t), "-c", e.write("lp-consumer.yaml", e.sinkConfig("lp-consumer")))
	e.autofix = []*testenv.Process{src, snk}
	e.pg.Exec(`INSERT INTO rt VALUES (203, 'after the fixes')`)
	e.waitCopy(0, src, snk)
	e.autofix = nil
	for _, p := range []*testenv.Process{src, snk} {
		if !strings.Contains(p.Output(), "redis_acl") {
			t.Errorf("no redis_acl error: %s", sinkLastLines(p.Output(), 10))
		}
	}
	e.wantCommands("lp-source", redisconn.SourceUses, "wait")
	e.wantCommands("lp-consumer", redisconn.ConsumerUses)
	e.rd.ACL("ACL LOG RESET")
	e.pg.Exec(`INSERT INTO rt VALUES (204, 'with the fixed users')`)
	e.waitCopy(0, src, snk)
	if d := e.aclDenials(); len(d) > 0 {
		t.Fatalf("Redis refused the fixed users: %v", d)
	}

	// A permission taken away while the pipelines run: redis_acl with the rule, and they carry on
	// once it ran.
	for _, c := range []struct {
		p    *testenv.Process
		rule string
	}{{src, "ACL SETUSER lp-source +xadd"}, {snk, "ACL SETUSER lp-consumer +xack"}} {
		e.rd.ACL(strings.Replace(c.rule, " +", " -", 1))
		e.pg.Exec(`INSERT INTO rt SELECT max(id) + 1, 'while refused' FROM rt WHERE id < 1000`)
		waitLine(t, c.p, "redis_acl", "Fix: "+c.rule)
		e.rd.ACL(c.rule)
		e.waitCopy(0, src, snk)
	}

	// The same for the CLI, the pipelines stopped: a read-only user and an operator holding only
	// their keys run each command until it passes; every refusal is redis_acl with the rule, the
	// run after the last rule is refused nothing, and the rules add up to the documented lines.
	// The operator's last command is teardown.
	src.Signal(syscall.SIGTERM)
	snk.Signal(syscall.SIGTERM)
	_, _ = src.Wait(15*time.Second), snk.Wait(15*time.Second)
	for _, u := range []struct {
		user string
		uses []redisconn.Use
		runs [][]string
	}{
		{"lp-cli", redisconn.CLIReadUses, nil},
		{"lp-operator", redisconn.CLIWriteUses, [][]string{{"queue", "dlq", "--replay"}, {"queue", "dlq", "--drop"}, {"resync"}, {"snapshot"}, {"teardown"}}},
	} {
		e.bareUser(u.user, "")
		conf, url := e.write(u.user+".yaml", e.sourceConfig(u.user)), e.rd.UserURL(u.user, lpPassword)
		sinkConf := e.write(u.user+"-sink.yaml", e.sinkConfig(u.user))
		for _, args := range append([][]string{{"status"}, {"status", "-c", sinkConf}, {"queue", "info"}, {"queue", "position"}, {"queue", "dlq"}}, u.runs...) {
			switch {
			case args[0] == "queue":
				args = append(args, "--url", url, "q")
			case args[0] == "snapshot":
				args = append(args, "-c", conf, "public.rt")
			case len(args) == 1:
				args = append(args, "-c", conf)
			}
			e.fixUntilOK(u.user, args...)
		}
		e.wantCommands(u.user, u.uses)
	}
	if n, err := e.rd.Client().Exists(e.ctx, "pgrelay:{q}:src:lp:ptr").Result(); err != nil || n != 0 {
		t.Errorf("after teardown the pointer is still there (%d, %v)", n, err)
	}
}

// fixRule is the ACL SETUSER line of a redis_acl error's fix.
var fixRule = regexp.MustCompile(`Fix: (ACL SETUSER \S+(?: [+~][^\s"\\]+)+)`)

// applyFixes runs every ACL SETUSER fix out prints; it returns how many it found.
func (e *lpEnv) applyFixes(out string) int {
	m := fixRule.FindAllStringSubmatch(out, -1)
	for _, f := range m {
		e.rd.ACL(f[1])
	}
	return len(m)
}

// bareUser (re)creates user with the keys under the prefix and, of the commands, only rules.
func (e *lpEnv) bareUser(user, rules string) {
	e.rd.ACL("ACL SETUSER " + user + " reset on >" + lpPassword + " ~pgrelay:* resetchannels -@all " + rules)
}

// fixUntilOK runs pgrelay with args as user until it exits 0: each failure must be redis_acl with
// an ACL SETUSER fix, which it runs. The run that passes must leave no refusal in ACL LOG.
func (e *lpEnv) fixUntilOK(user string, args ...string) {
	e.t.Helper()
	for range 10 {
		e.rd.ACL("ACL LOG RESET")
		out, ok := e.cli(args...)
		if ok {
			if d := e.aclDenials(); len(d) > 0 {
				e.t.Errorf("pgrelay %s as %s passed with refusals: %v", strings.Join(args, " "), user, d)
			}
			return
		}
		if !strings.Contains(out, "redis_acl") || e.applyFixes(out) == 0 {
			e.t.Fatalf("pgrelay %s as %s: %s, want redis_acl with an ACL SETUSER fix", strings.Join(args, " "), user, out)
		}
	}
	e.t.Fatalf("pgrelay %s as %s: still refused after 10 fixes", strings.Join(args, " "), user)
}

// wantCommands checks that user holds exactly the commands of uses but except.
func (e *lpEnv) wantCommands(user string, uses []redisconn.Use, except ...string) {
	e.t.Helper()
	res, err := e.rd.Client().Do(e.ctx, "ACL", "GETUSER", user).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var rules string
	switch v := res.(type) {
	case map[any]any:
		rules = fmt.Sprint(v["commands"])
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == "commands" {
				rules = fmt.Sprint(v[i+1])
			}
		}
	}
	// Redis prints the rules compacted (+@transaction for MULTI, EXEC, DISCARD, then -watch
	// -unwatch): apply them in order.
	set := map[string]bool{}
	for _, r := range strings.Fields(rules) {
		names := []string{r[1:]}
		if cat, ok := strings.CutPrefix(r[1:], "@"); ok {
			if names, err = e.rd.Client().Do(e.ctx, "COMMAND", "LIST", "FILTERBY", "ACLCAT", cat).StringSlice(); err != nil {
				e.t.Fatal(err)
			}
		}
		for _, n := range names {
			set[n] = r[0] == '+'
		}
	}
	var got []string
	for c, on := range set {
		if on {
			got = append(got, c)
		}
	}
	var want []string
	for _, c := range redisconn.ACLCommands(uses...) {
		if !slices.Contains(except, c) {
			want = append(want, c)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		e.t.Errorf("%s took %v, its documented line has %v", user, got, want)
	}
}

// waitLine waits until the process printed a line holding every one of parts.
func waitLine(t *testing.T, p *testenv.Process, parts ...string) {
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
