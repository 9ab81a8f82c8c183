package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestServersThatDoNotAnswerAreTransient runs the binary against servers that do not answer, and
// reads what an operator sees: pg_cdc counts a PostgreSQL that does not answer as a transient error
// (`pgrelay_source_errors{code="transient"}`, the alert rules' lost connection) and stays in phase
// connecting; pg_sink counts it as `pg_sink_errors{class="transient",code="pg_unreachable"}` and is
// not paused, while a database that does not exist pauses it (class environment, pg_sink_paused 1);
// and the lines go-redis writes about a Redis that does not answer come out in Benthos' logfmt
// with library=go-redis, not in go-redis's own format.
func TestServersThatDoNotAnswerAreTransient(t *testing.T) {
	rd := testenv.StartRedis(t)
	pg := testenv.StartPostgres(t)
	closedPG := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", testenv.FreePort(t))
	ctx := t.Context()
	scrape := func(port int) string {
		body, err := testenv.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 10*time.Second)
		if err != nil {
			return ""
		}
		return body
	}

	// pg_cdc
	srcPort := testenv.FreePort(t)
	src := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", writeConfig(t, "source.yaml", cdctest.Pipeline{
		Name: "gone", DSN: closedPG, Tables: `[{table: t, queue: q}]`, Redis: rd.URL(), LogLevel: "info",
		Top: fmt.Sprintf("http: {address: \"127.0.0.1:%d\"}\nmetrics: {prometheus: {}}", srcPort)}.YAML()))
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "pg_cdc: a transient error, phase connecting", func() (bool, string) {
		body := scrape(srcPort)
		return hasSeries(body, "pgrelay_source_errors", `[1-9]\d*`, `code="transient"`, `source="gone"`) &&
			hasSeries(body, "pgrelay_source_phase", "1", `phase="connecting"`, `source="gone"`), grepLines(body, "pgrelay_source_") + "\n" + lastBytes(src.Output(), 600)
	})
	if body := scrape(srcPort); strings.Contains(body, `code="pg_unreachable"`) {
		t.Errorf("pg_unreachable counted under its own code, not as transient:\n%s", grepLines(body, "pgrelay_source_errors"))
	}
	// the error is counted before its line is logged: wait for the line
	cdctest.WaitEvery(t, 10*time.Second, 100*time.Millisecond, "the log naming pg_unreachable", func() (bool, string) {
		return strings.Contains(src.Output(), "pg_unreachable"), lastBytes(src.Output(), 1000)
	})

	// pg_sink: a server that does not answer, then a database that does not exist
	for _, c := range []struct {
		name, dsn, class, code string
		paused                 bool
	}{
		{"down", closedPG, "transient", "pg_unreachable", false},
		{"nodb", pg.DatabaseDSN("nodb"), "environment", "pg_database", true},
	} {
		port := testenv.FreePort(t)
		p := startSinkPipeline(t, fmt.Sprintf(`http: {address: "127.0.0.1:%d"}
metrics: {prometheus: {}}
logger: {level: warn}
input:
  redis_queue: {url: %s, queue: q, group: %s}
output:
  pg_sink: {dsn: %q, name: %s, table: public.copy, mode: cdc}
`, port, rd.URL(), c.name, c.dsn, c.name))
		paused := func(body string) bool { return hasSeries(body, "pg_sink_paused", "1", `sink="`+c.name+`"`) }
		cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "pg_sink "+c.name+": "+c.class+" "+c.code, func() (bool, string) {
			body := scrape(port)
			return hasSeries(body, "pg_sink_errors", `[1-9]\d*`, `sink="`+c.name+`"`, `class="`+c.class+`"`, `code="`+c.code+`"`) &&
					paused(body) == c.paused,
				grepLines(body, "pg_sink_") + "\n" + lastBytes(p.Output(), 600)
		})
		time.Sleep(2 * time.Second) // a further retry or two
		if body := scrape(port); paused(body) != c.paused {
			t.Errorf("pg_sink %s: paused %v, want %v:\n%s", c.name, !c.paused, c.paused, grepLines(body, "pg_sink_"))
		}
		p.Kill()
	}

	// go-redis's lines about a Redis that does not answer
	closedRedis := fmt.Sprintf("redis://127.0.0.1:%d", testenv.FreePort(t))
	out := startSinkPipeline(t, fmt.Sprintf(`http: {enabled: false}
logger: {level: debug, format: logfmt}
input:
  generate: {mapping: 'root = "x"', interval: 100ms}
output:
  redis_queue: {url: %s, queue: q}
`, closedRedis))
	goRedis := regexp.MustCompile(`(?m)^time=\S+ level=debug msg=".*failed to dial.*" .*\blibrary=go-redis\b`)
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "a go-redis line in logfmt with library=go-redis, and the output's redis_unreachable", func() (bool, string) {
		return goRedis.MatchString(out.Output()) && strings.Contains(out.Output(), "redis_unreachable"), lastBytes(out.Output(), 1500)
	})
	for _, l := range strings.Split(out.Output(), "\n") {
		if strings.HasPrefix(l, "redis: ") {
			t.Errorf("a line in go-redis's own format: %s", l)
		}
	}
}

// hasSeries reports whether the Prometheus text body has a sample of the metric name carrying every
// one of labels (`k="v"`, among any others) whose value matches the regular expression value.
func hasSeries(body, name, value string, labels ...string) bool {
	v := regexp.MustCompile(`^(?:` + value + `)$`)
next:
	for _, l := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(l, name+"{")
		if !ok {
			continue
		}
		end := strings.LastIndex(rest, "} ")
		if end < 0 {
			continue
		}
		set := "," + rest[:end] + ","
		for _, want := range labels {
			if !strings.Contains(set, ","+want+",") {
				continue next
			}
		}
		if v.MatchString(rest[end+2:]) {
			return true
		}
	}
	return false
}

// TestReadyFollowsTheSource: Benthos' /ready answers 503 while pg_cdc cannot start (here its
// database does not exist yet), and 200 once it streams, the input shown as not connected until
// then; a second replica of the same source, standing by, is ready too; what was written after the
// start reaches the queue. When the streaming replica loses its database (connections refused) it
// is not ready until it streams again, and the rows written after reach the queue.
func TestReadyFollowsTheSource(t *testing.T) {
	pg := testenv.StartPostgres(t)
	rd := testenv.StartRedis(t)
	ctx := t.Context()
	pipeline := func(port int) string {
		return writeConfig(t, fmt.Sprintf("r%d.yaml", port), cdctest.Pipeline{Name: "later", DSN: pg.DatabaseDSN("later"), Tables: `[{table: t, queue: q}]`,
			Redis: rd.URL(), Durability: "aof", LogLevel: "info", Top: fmt.Sprintf("http: {address: \"127.0.0.1:%d\"}", port)}.YAML())
	}
	ready := func(port int) (int, string) { return getReady(ctx, port) }
	port := testenv.FreePort(t)
	first := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", pipeline(port))
	cdctest.WaitEvery(t, 30*time.Second, 100*time.Millisecond, "the HTTP server", func() (bool, string) {
		code, body := ready(port)
		return code != 0, body
	})
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if code, body := ready(port); code != 503 || !strings.Contains(body, `"path":"input","connected":false`) {
			t.Fatalf("/ready %d %s while the database does not exist, want 503 with the input not connected", code, body)
		}
	}
	pg.Exec(`CREATE DATABASE later`)
	later := cdctest.Conn(t, pg.DatabaseDSN("later"))
	if _, err := later.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	cdctest.WaitEvery(t, 90*time.Second, 200*time.Millisecond, "/ready 200 once pg_cdc streams", func() (bool, string) {
		code, body := ready(port)
		return code == 200, fmt.Sprintf("%d %s\n%s", code, body, lastBytes(first.Output(), 800))
	})
	standbyPort := testenv.FreePort(t)
	standby := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", pipeline(standbyPort))
	cdctest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, "/ready 200 on the replica standing by", func() (bool, string) {
		code, body := ready(standbyPort)
		return code == 200, fmt.Sprintf("%d %s\n%s", code, body, lastBytes(standby.Output(), 800))
	})
	cdctest.WaitStatus(t, 10*time.Second, rd.Client(), "q", "later", `"phase":"standby"`)
	if _, err := later.Exec(ctx, `INSERT INTO t VALUES (1, 'a'), (2, 'b')`); err != nil {
		t.Fatal(err)
	}
	rowsInQueue(t, rd, "q", 2)

	// The database stops taking connections and the walsender goes: the streaming replica is no
	// longer ready (the standby, which does not stream, stays so); taking connections again, it is.
	standby.Kill()
	pg.Exec(`ALTER DATABASE later ALLOW_CONNECTIONS false`)
	pg.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'later' AND pid <> pg_backend_pid()`)
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "/ready 503 while the database refuses connections", func() (bool, string) {
		code, body := ready(port)
		return code == 503 && strings.Contains(body, `"path":"input","connected":false`), fmt.Sprintf("%d %s\n%s", code, body, lastBytes(first.Output(), 800))
	})
	waits(t, first, "pg_cdc waiting for the database")
	pg.Exec(`ALTER DATABASE later ALLOW_CONNECTIONS true`)
	cdctest.WaitEvery(t, 90*time.Second, 200*time.Millisecond, "/ready 200 again", func() (bool, string) {
		code, body := ready(port)
		return code == 200, fmt.Sprintf("%d %s\n%s", code, body, lastBytes(first.Output(), 800))
	})
	later = cdctest.Conn(t, pg.DatabaseDSN("later"))
	if _, err := later.Exec(ctx, `INSERT INTO t VALUES (3, 'c')`); err != nil {
		t.Fatal(err)
	}
	rowsInQueue(t, rd, "q", 3)
}

// getReady reads /ready of the binary's HTTP server on port: the status code (0 when it does not
// answer) and the body.
func getReady(ctx context.Context, port int) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/ready", port), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// numberSink is a redis_queue input → pg_sink (append) pipeline run by the binary, applying
// messages {"n": i} of queue q to table got, with its HTTP server on port.
type numberSink struct {
	t    *testing.T
	pg   *testenv.Postgres
	rd   *testenv.Redis
	w    *queue.Writer
	port int
	p    *testenv.Process
}

func startNumberSink(t *testing.T) *numberSink {
	e := &numberSink{t: t, pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always"), port: testenv.FreePort(t)}
	e.pg.Exec(`CREATE TABLE got (n int PRIMARY KEY)`)
	e.w = queue.NewWriter(e.rd.Client(), queue.WriterConfig{Shards: 2})
	e.p = startSinkPipeline(t, fmt.Sprintf(`http: {address: "127.0.0.1:%d"}
logger: {level: info}
input:
  redis_queue: {url: %s, queue: q, group: g, lease_ttl: 3s}
output:
  pg_sink: {dsn: %q, name: got, table: public.got, mode: append}
`, e.port, e.rd.URL(), e.pg.DSN()))
	return e
}

// write queues the messages from..to.
func (e *numberSink) write(from, to int) {
	e.t.Helper()
	var msgs []queue.Message
	for i := from; i <= to; i++ {
		msgs = append(msgs, queue.Message{Queue: "q", Partition: fmt.Sprint(i % 5), ID: fmt.Sprint("m", i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if _, err := e.w.Write(e.t.Context(), msgs, nil); err != nil {
		e.t.Fatal(err)
	}
}

// rows waits until the table holds want rows, each n once.
func (e *numberSink) rows(want int) {
	e.t.Helper()
	cdctest.WaitEvery(e.t, 90*time.Second, 200*time.Millisecond, fmt.Sprintf("%d rows applied", want), func() (bool, string) {
		var n, distinct int
		err := e.pg.Pool().QueryRow(e.t.Context(), `SELECT count(*), count(DISTINCT n) FROM got`).Scan(&n, &distinct)
		return err == nil && n == want && distinct == want, fmt.Sprintf("%d rows (%d distinct), %v", n, distinct, err)
	})
}

// waitReady waits until /ready answers code, its body holding want when given.
func (e *numberSink) waitReady(what string, code int, want string) {
	e.t.Helper()
	waitReady(e.t, e.port, e.p, what, code, want)
}

// waitReady waits until /ready of the binary p (its HTTP server on port) answers code, its body
// holding want when given.
func waitReady(t *testing.T, port int, p *testenv.Process, what string, code int, want string) {
	t.Helper()
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, what, func() (bool, string) {
		got, body := getReady(t.Context(), port)
		return got == code && strings.Contains(body, want), fmt.Sprintf("%d %s\n%s", got, body, lastBytes(p.Output(), 800))
	})
}

// rowsInQueue waits until replaying queue q gives table public.t n rows, without problems.
func rowsInQueue(t *testing.T, rd *testenv.Redis, q string, n int) {
	t.Helper()
	cdctest.WaitEvery(t, 90*time.Second, 200*time.Millisecond, fmt.Sprintf("%d rows in the queue", n), func() (bool, string) {
		entries, err := oracle.ReadQueue(t.Context(), rd.Client(), "pgrelay", q)
		if err != nil {
			return false, err.Error()
		}
		res := oracle.Replay(entries)
		return len(res.Tables["public.t"]) == n && len(res.Problems) == 0, fmt.Sprintf("%d entries, %v", len(entries), res.Problems)
	})
}

// waits checks that a pipeline not ready waits rather than spins: over 3 s its process uses less
// than a tenth of a core (a Connect that returned at once while ReadBatch or WriteBatch reports
// not connected would make Benthos call both in a loop, a whole core).
func waits(t *testing.T, p *testenv.Process, what string) {
	t.Helper()
	const window = 3 * time.Second
	c0 := cpuTime(t, p.Pid())
	time.Sleep(window)
	if used := cpuTime(t, p.Pid()) - c0; used > window/10 {
		t.Errorf("%s: pgrelay used %s of CPU in %s (more than 10 %% of a core)", what, used, window)
	}
}

// TestConsumerReadyFollowsRedis: a redis_queue input → pg_sink pipeline is ready while it reads;
// with Redis killed, once the replica has dropped its shards (lease_ttl 3 s) /ready answers 503
// (the input not connected) and it waits for Redis without spinning; with Redis back it is ready
// again and applies what was written after, every message once.
func TestConsumerReadyFollowsRedis(t *testing.T) {
	e := startNumberSink(t)
	e.outage(e.rd, "Redis", "input", false)
}

// TestSinkReadyFollowsPostgres: a redis_queue input → pg_sink pipeline is ready while it applies;
// with PostgreSQL killed, a write that cannot connect makes the output not connected (/ready 503)
// instead of retrying inside the write; with PostgreSQL back it is ready again and every message,
// those written while it was down included, is applied once.
func TestSinkReadyFollowsPostgres(t *testing.T) {
	e := startNumberSink(t)
	e.outage(e.pg, "PostgreSQL", "output", true)
}

// outage runs the pipeline through an outage of srv (named name): 10 messages applied and /ready
// 200; srv killed (10 more messages queued meanwhile when writeDuring); /ready 503 with the
// component at path not connected, the process waiting without spinning; srv restarted, /ready
// 200, 10 more messages, and every message applied once.
func (e *numberSink) outage(srv interface {
	Kill()
	Restart()
}, name, path string, writeDuring bool) {
	e.t.Helper()
	e.write(1, 10)
	e.rows(10)
	if code, body := getReady(e.t.Context(), e.port); code != 200 {
		e.t.Fatalf("/ready %d %s while applying", code, body)
	}
	srv.Kill()
	n := 10
	if writeDuring {
		e.write(11, 20)
		n = 20
	}
	e.waitReady("/ready 503 with "+name+" gone", 503, `"path":"`+path+`","connected":false`)
	waits(e.t, e.p, "the "+path+" waiting for "+name)
	srv.Restart()
	e.waitReady("/ready 200 with "+name+" back", 200, "")
	e.write(n+1, n+10)
	e.rows(n + 10)
}

// TestSourceReadyFollowsRedis: a pg_cdc → redis_queue pipeline is ready while it streams; with
// Redis killed, a write that cannot reach it makes the output not connected (/ready 503) while
// Benthos holds the batch; with Redis back it is ready again and every row, those committed while
// Redis was down included, is in the queue once.
func TestSourceReadyFollowsRedis(t *testing.T) {
	pg := testenv.StartPostgres(t)
	rd := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	port := testenv.FreePort(t)
	p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", writeConfig(t, "ready.yaml", cdctest.Pipeline{Name: "rdy", DSN: pg.DSN(), Tables: `[{table: t, queue: q}]`,
		Redis: rd.URL(), Durability: "aof", LogLevel: "info", Top: fmt.Sprintf("http: {address: \"127.0.0.1:%d\"}", port)}.YAML()))
	waitReady(t, port, p, "/ready 200 once pg_cdc streams", 200, "")
	pg.Exec(`INSERT INTO t SELECT g, 'a' FROM generate_series(1, 10) g`)
	rowsInQueue(t, rd, "q", 10)
	rd.Kill()
	pg.Exec(`INSERT INTO t SELECT g, 'b' FROM generate_series(11, 20) g`)
	waitReady(t, port, p, "/ready 503 with Redis gone", 503, `"path":"output","connected":false`)
	waits(t, p, "the pipeline waiting for Redis")
	rd.Restart()
	waitReady(t, port, p, "/ready 200 with Redis back", 200, "")
	pg.Exec(`INSERT INTO t SELECT g, 'c' FROM generate_series(21, 30) g`)
	rowsInQueue(t, rd, "q", 30)
}

// TestQueueOutputReadyFollowsRedis: a generate → redis_queue pipeline is ready while it writes;
// with Redis killed, a write that cannot reach it makes the output not connected (/ready 503, the
// batch held, not dropped); with Redis back it is ready again and the queue holds every message
// from the first to the last written, none missing.
func TestQueueOutputReadyFollowsRedis(t *testing.T) {
	rd := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	g := startGenerate(t, fmt.Sprintf("url: %s, durability: aof", rd.URL()), rd.Client())
	g.waitReady("/ready 200 while writing", 200, "")
	rd.Kill()
	g.waitReady("/ready 503 with Redis gone", 503, `"path":"output","connected":false`)
	waits(t, g.p, "the output waiting for Redis")
	rd.Restart()
	g.waitReady("/ready 200 with Redis back", 200, "")
	g.resumed()
}

// TestQueueOutputWaitsForAClusterNode: generate → redis_queue on a three-master Redis Cluster
// whose master of the queue's slot is killed (no replica to promote), the other masters still up:
// the output reports not connected (/ready 503), its reconnects and writes are paced, not spun
// (less than a tenth of a core, a handful of lines logged), and with the node back every number is
// in the queue.
func TestQueueOutputWaitsForAClusterNode(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	urls := ""
	for _, a := range rc.Addrs() {
		urls += fmt.Sprintf("redis://%s, ", a)
	}
	g := startGenerate(t, "cluster_urls: ["+urls+"]", rc.Client(t))
	g.waitReady("/ready 200 while writing", 200, "")
	master, _ := rc.MasterOf(queue.NewLayout("pgrelay").Meta("q"))
	if master == nil {
		t.Fatal("no master of the queue's slot")
	}
	master.Kill()
	g.waitReady("/ready 503 with the queue's node gone", 503, `"path":"output","connected":false`)
	before := strings.Count(g.p.Output(), "redis_unreachable")
	waits(t, g.p, "the output waiting for the queue's node")
	if n := strings.Count(g.p.Output(), "redis_unreachable") - before; n > 10 {
		t.Errorf("%d failed reconnects or writes logged in 3 s, want them paced", n)
	}
	master.Restart()
	rc.WaitWhole(60 * time.Second)
	g.waitReady("/ready 200 with the node back", 200, "")
	g.resumed()
}

// generated is a generate → redis_queue pipeline run by the binary: {"n": 1, 2, …} every 20 ms
// into queue q (2 shards), its HTTP server on port.
type generated struct {
	t    *testing.T
	rdb  redis.Cmdable
	port int
	p    *testenv.Process
}

// startGenerate starts it with the output's connection fields conn, rdb reading the same Redis.
func startGenerate(t *testing.T, conn string, rdb redis.Cmdable) *generated {
	g := &generated{t: t, rdb: rdb, port: testenv.FreePort(t)}
	g.p = testenv.StartProcess(t, nil, testenv.Binary(t), "-c", writeConfig(t, "gen.yaml", fmt.Sprintf(`http: {address: "127.0.0.1:%d"}
logger: {level: info}
input:
  generate: {interval: 20ms, mapping: 'root = {"n": counter()}'}
output:
  redis_queue: {%s, queue: q, shards: 2}
`, g.port, conn)))
	return g
}

func (g *generated) waitReady(what string, code int, want string) {
	g.t.Helper()
	waitReady(g.t, g.port, g.p, what, code, want)
}

// numbers reads the queue: the highest n and how many of 1..highest are missing.
func (g *generated) numbers() (high, missing int, err error) {
	entries, err := oracle.ReadQueue(g.t.Context(), g.rdb, "pgrelay", "q")
	if err != nil {
		return 0, 0, err
	}
	seen := map[int]bool{}
	for _, e := range entries {
		var m struct{ N int }
		if err := json.Unmarshal(e.Payload, &m); err != nil {
			return 0, 0, err
		}
		seen[m.N] = true
		high = max(high, m.N)
	}
	for n := 1; n <= high; n++ {
		if !seen[n] {
			missing++
		}
	}
	return high, missing, nil
}

// resumed waits until more numbers are written, then checks that none is missing.
func (g *generated) resumed() {
	g.t.Helper()
	var before int
	cdctest.WaitEvery(g.t, 30*time.Second, 200*time.Millisecond, "messages written after the outage", func() (bool, string) {
		high, _, err := g.numbers()
		if before == 0 {
			before = high
		}
		return err == nil && high > before+20, fmt.Sprintf("highest %d (at the end of the outage %d), %v", high, before, err)
	})
	if high, missing, err := g.numbers(); err != nil || missing != 0 {
		g.t.Fatalf("queue up to %d: %d missing (%v)", high, missing, err)
	}
}
