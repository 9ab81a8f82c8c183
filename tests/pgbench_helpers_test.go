package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// pgbenchTable is one of pgbench's keyed tables: streamed by pg_cdc into its own queue and copied by
// its own sink pipeline into the same table of database copy. pgbench_history has no key and is
// not streamed.
type pgbenchTable struct{ table, queue, key string }

var pgbenchTables = []pgbenchTable{
	{"public.pgbench_accounts", "accounts", "aid"},
	{"public.pgbench_branches", "branches", "bid"},
	{"public.pgbench_tellers", "tellers", "tid"},
}

// pgbenchGroup is the consumer group of every sink pipeline.
const pgbenchGroup = "copy"

func (pt pgbenchTable) sinkName() string { return "copy_" + pt.queue }

// pgbenchEnv is pgbench's tables (scale 1: 100,000 accounts, 10 tellers, 1 branch) in database
// postgres, an empty copy of them in database copy, and the pipeline files a pgrelay replica runs
// with `pgrelay streams`: source.yaml (pg_cdc with `snapshot: initial` → redis_queue, one queue per
// table) and one sink file per table (redis_queue → pg_sink cdc). Every replica runs the same files.
type pgbenchEnv struct {
	*cdcEnv
	bench    string // pgbench
	copyDSN  string
	copy     *pgxpool.Pool
	dir      string
	leaseTTL string
	streams  []string // the pipeline files, in the order given to `pgrelay streams`
}

// pgbenchOptions shape the pipelines: lease_ttl of the source and of every sink input, and extra
// fields of the source's redis_queue output (e.g. retention).
type pgbenchOptions struct {
	leaseTTL    string
	outputExtra string
}

func newPgbenchEnv(t *testing.T, o pgbenchOptions) *pgbenchEnv {
	t.Helper()
	pg := testenv.StartPostgres(t)
	var tables []string
	for _, pt := range pgbenchTables {
		tables = append(tables, fmt.Sprintf("{table: %s, queue: %s}", pt.table, pt.queue))
	}
	e := &pgbenchEnv{
		cdcEnv:   newCDCEnvOn(t, pg, pg.DSN(), "pgbench", "["+strings.Join(tables, ", ")+"]", ""),
		bench:    pgbenchBinary(t, pg),
		dir:      t.TempDir(),
		leaseTTL: o.leaseTTL,
	}
	e.queue = pgbenchTables[0].queue // the source's lease and pointer live under its first queue
	e.pgbench("-i", "-q", "-s", "1", pg.DSN())
	e.copyDSN = pg.CreateDatabase("copy")
	e.pgbench("-i", "-q", "-I", "dtp", e.copyDSN) // the tables and keys, no rows
	pool, err := pgxpool.New(e.ctx, e.copyDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.copy = pool

	e.streams = append(e.streams, e.writeFile("source.yaml", fmt.Sprintf(`input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: [%s]
    redis: {url: %s}
    snapshot: initial
    lease_ttl: %s
output:
  redis_queue:
    url: %s
    durability: aof
%s`, e.name, pg.DSN(), strings.Join(tables, ", "), e.rd.URL(), o.leaseTTL, e.rd.URL(), cdctest.Indent(o.outputExtra, "    "))))
	for _, pt := range pgbenchTables {
		e.streams = append(e.streams, e.writeFile("sink_"+pt.queue+".yaml", fmt.Sprintf(`input:
  redis_queue:
    url: %s
    queue: %s
    group: %s
    start_from: earliest
    lease_ttl: %s
output:
  pg_sink:
    dsn: %s
    name: %s
    table: %s
    mode: cdc
`, e.rd.URL(), pt.queue, pgbenchGroup, o.leaseTTL, e.copyDSN, pt.sinkName(), pt.table)))
	}
	return e
}

func (e *pgbenchEnv) writeFile(name, body string) string {
	e.t.Helper()
	path := filepath.Join(e.dir, name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// pgbenchBinary finds PostgreSQL's pgbench: beside the server, in another installed PostgreSQL's
// bin directory (any client version drives any server), or on PATH.
func pgbenchBinary(t *testing.T, pg *testenv.Postgres) string {
	t.Helper()
	dirs := []string{pg.BinDir}
	bins := testenv.PostgresBins()
	var majors []int
	for m := range bins {
		majors = append(majors, m)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(majors)))
	for _, m := range majors {
		dirs = append(dirs, bins[m])
	}
	for _, d := range dirs {
		if p := filepath.Join(d, "pgbench"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	if testenv.InCI() {
		t.Fatal("pgbench not found (scripts/setup installs postgresql-15, which has it)")
	}
	t.Skip("pgbench not found")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// pgbench runs pgbench to completion (initialisation steps).
func (e *pgbenchEnv) pgbench(args ...string) {
	e.t.Helper()
	out, err := exec.Command(e.bench, args...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("pgbench %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// startLoad runs pgbench's default TPC-B-like script for d with 4 clients on 2 threads (rate:
// transactions per second in all, 0 = as fast as it goes); the process's Wait ends with it.
func (e *pgbenchEnv) startLoad(d time.Duration, rate int) *testenv.Process {
	args := []string{"-c", "4", "-j", "2", "-n", "-T", strconv.Itoa(int(d.Seconds())), "-P", "30"}
	if rate > 0 {
		args = append(args, "-R", strconv.Itoa(rate))
	}
	return testenv.StartProcess(e.t, nil, e.bench, append(args, e.pg.DSN())...)
}

// pgbenchTPS reads the "tps = N" figure of pgbench's summary.
func pgbenchTPS(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tps = ") {
			return strings.Fields(line)[2]
		}
	}
	return "?"
}

// replica is one pgrelay process running every pipeline of the env, with its own HTTP port
// (Prometheus metrics with the Go runtime's, e.g. go_goroutines, on /metrics; Go's profiles on
// /debug/pprof/).
type replica struct {
	n    int
	port int
	root string
	p    *testenv.Process
}

func (e *pgbenchEnv) newReplica(n int) *replica {
	r := &replica{n: n, port: testenv.FreePort(e.t)}
	r.root = e.writeFile(fmt.Sprintf("replica%d.yaml", n), fmt.Sprintf(`http:
  address: 127.0.0.1:%d
  debug_endpoints: true
metrics:
  prometheus:
    add_go_metrics: true
logger:
  level: info
  format: logfmt
shutdown_timeout: 20s
`, r.port))
	e.start(r)
	return r
}

// start runs `pgrelay streams` for r (again, after it ended).
func (e *pgbenchEnv) start(r *replica) {
	args := append([]string{"streams", "--no-api", "-o", r.root}, e.streams...)
	r.p = testenv.StartProcess(e.t, nil, testenv.Binary(e.t), args...)
}

// metricsURL is r's Prometheus endpoint.
func (r *replica) metricsURL() string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", r.port) }

// progress reads the copy's progress rows of pt's sink: shard → last_offset.
func (e *pgbenchEnv) progress(pt pgbenchTable) map[int]int64 {
	rows, err := e.copy.Query(e.ctx, `SELECT shard, last_offset FROM pgrelay.sink_progress WHERE sink = $1 AND queue = $2`, pt.sinkName(), pt.queue)
	if err != nil {
		return nil // not created yet
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var s int
		var o int64
		if rows.Scan(&s, &o) == nil {
			out[s] = o
		}
	}
	return out
}

// caughtUp reports whether the source's pointer covers lsn (a pg_current_wal_lsn() read after the
// load stopped), every sink has applied its whole queue (group lag and pending 0, each shard's
// progress row at the shard's last offset, no dead letters) and every copied table equals its
// source, md5 per row; otherwise what is still missing.
func (e *pgbenchEnv) caughtUp(lsn pglogrepl.LSN) (bool, string) {
	p := e.pointer()
	if p == nil || p.InTxn != nil || p.LSNValue()+1 < lsn {
		return false, fmt.Sprintf("source pointer %v short of %s", p, lsn)
	}
	for _, pt := range pgbenchTables {
		info, err := queue.Inspect(e.ctx, e.rd.Client(), queue.NewLayout("pgrelay"), pt.queue)
		if err != nil {
			return false, err.Error()
		}
		if info.DeadLetters != 0 {
			return false, fmt.Sprintf("queue %s: %d dead letters", pt.queue, info.DeadLetters)
		}
		for _, g := range info.Groups {
			if g.Lag > 0 || g.Pending > 0 {
				return false, fmt.Sprintf("queue %s: group %s lag %d pending %d", pt.queue, g.Name, g.Lag, g.Pending)
			}
		}
		applied := e.progress(pt)
		for _, s := range info.ShardInfo {
			if applied[s.Shard] != s.LastOffset {
				return false, fmt.Sprintf("sink %s shard %d at %d of %d", pt.sinkName(), s.Shard, applied[s.Shard], s.LastOffset)
			}
		}
		if ok, state := e.sameRows(pt); !ok {
			return false, state
		}
	}
	return true, ""
}

// sameRows is the sink oracle: md5 of every row of pt's copy equals the source's.
func (e *pgbenchEnv) sameRows(pt pgbenchTable) (bool, string) {
	_, name, _ := strings.Cut(pt.table, ".")
	want, err := tableHashes(e.ctx, e.pg.Pool(), name, pt.key)
	if err != nil {
		return false, err.Error()
	}
	got, err := tableHashes(e.ctx, e.copy, name, pt.key)
	if err != nil {
		return false, err.Error()
	}
	if d := hashDiff(want, got); len(d) > 0 {
		return false, fmt.Sprintf("%s: source %d rows, copy %d: %s", pt.table, len(want), len(got), strings.Join(d, "; "))
	}
	return true, ""
}

// waitCaughtUp waits up to d for caughtUp after the load stopped; on timeout it runs the queue
// oracle and shows the queue's entries of a few differing rows, so a failure says whether the
// queue or the sink went wrong.
func (e *pgbenchEnv) waitCaughtUp(d time.Duration) {
	e.t.Helper()
	lsn := e.currentLSN()
	if ok, state := cdctest.Poll(d, time.Second, func() (bool, string) { return e.caughtUp(lsn) }); !ok {
		e.t.Errorf("timed out waiting for the copy equal to the source: %s", state)
		e.explainDiff()
		e.t.FailNow()
	}
}

// explainDiff runs the queue oracle without stopping and logs, for a few rows whose copy differs,
// the source row, the copied row and every queue entry of the row's key.
func (e *pgbenchEnv) explainDiff() {
	e.t.Helper()
	conn := e.conn()
	for _, pt := range pgbenchTables {
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", pt.queue)
		if err != nil {
			e.t.Error(err)
			return
		}
		res := oracle.Replay(entries)
		rows, err := oracle.TableRows(e.ctx, conn, pt.table, []string{pt.key})
		if err != nil {
			e.t.Error(err)
			return
		}
		diffs := append(res.Problems, oracle.Compare(res.Tables[pt.table], rows)...)
		e.t.Logf("queue oracle on %s: %d entries, %d differences from the table %v; sink progress %v", pt.queue, len(entries), len(diffs), diffs[:min(len(diffs), 5)], e.progress(pt))
		_, name, _ := strings.Cut(pt.table, ".")
		want, _ := tableHashes(e.ctx, e.pg.Pool(), name, pt.key)
		got, _ := tableHashes(e.ctx, e.copy, name, pt.key)
		shown := 0
		for id, h := range want {
			if got[id] == h || shown == 3 {
				continue
			}
			shown++
			e.t.Logf("%s %s=%d: source %s, copy %q", pt.table, pt.key, id, rowText(e, e.pg.Pool(), pt, id), rowText(e, e.copy, pt, id))
			frag := fmt.Sprintf(`"key":{%q:%d}`, pt.key, id)
			for _, en := range entries {
				if strings.Contains(string(en.Payload), frag) {
					e.t.Logf("  queue %s shard %d off %d id %s: %s", pt.queue, en.Shard, en.Off, en.ID, clip(string(en.Payload)))
				}
			}
		}
	}
}

// rowText is one row of pt as JSON text ("" when there is none).
func rowText(e *pgbenchEnv, pool *pgxpool.Pool, pt pgbenchTable, id int64) string {
	var s string
	_ = pool.QueryRow(e.ctx, `SELECT row_to_json(t)::text FROM `+pt.table+` t WHERE `+pt.key+` = $1`, id).Scan(&s)
	return s
}

// checkQueues is the queue oracle on every queue: each replays (every id once, offsets
// contiguous, lsn monotonic per partition, each key in one partition) to exactly its table.
func (e *pgbenchEnv) checkQueues() (entries int) {
	e.t.Helper()
	conn := e.conn()
	for _, pt := range pgbenchTables {
		got, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", pt.queue)
		if err != nil {
			e.t.Fatal(err)
		}
		entries += len(got)
		res := oracle.Replay(got)
		rows, err := oracle.TableRows(e.ctx, conn, pt.table, []string{pt.key})
		if err != nil {
			e.t.Fatal(err)
		}
		diffs := append(res.Problems, oracle.Compare(res.Tables[pt.table], rows)...)
		for i, d := range diffs {
			if i < 20 {
				e.t.Errorf("queue %s: %s", pt.queue, d)
			}
		}
		if len(diffs) > 0 {
			e.t.Fatalf("queue %s: %d differences from %s (%d entries)", pt.queue, len(diffs), pt.table, len(got))
		}
	}
	return entries
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// envDuration reads a duration from the environment, else def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// envInt reads an integer from the environment, else def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
