package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// failoverAckBound is how long after the Redis servers are whole again pg_cdc's writes must be
// acknowledged again. The goal is 10 s; the bound is generous for a loaded CI machine but far
// below the 60 s of a client waiting for go-redis's periodic slot-map reload.
const failoverAckBound = 25 * time.Second

// failoverEnv is PostgreSQL with table w, a copy database, and the two pgrelay processes of a
// Redis with failover (Sentinel or Cluster): pg_cdc → redis_queue with durability {replicas: 1},
// and redis_queue → pg_sink (cdc) into the copy.
type failoverEnv struct {
	*cdcEnv
	tt       *testing.T
	redis    redisconn.Config // how the test itself reaches Redis (a new client per read)
	connYAML string           // the same, as the connection fields of a config (a flow mapping's inside)
	copy     *pgxpool.Pool
	sinkConf string
}

func newFailoverEnv(t *testing.T, conn redisconn.Config, connYAML string) *failoverEnv {
	e := &failoverEnv{cdcEnv: &cdcEnv{t: t, ctx: context.Background(), pg: testenv.StartPostgres(t), name: "fo", queue: "orders"},
		tt: t, redis: conn, connYAML: connYAML}
	e.pg.Exec(writerTable)
	copyDSN := e.pg.CreateDatabase("copy")
	var err error
	if e.copy, err = pgxpool.New(e.ctx, copyDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.copy.Close)
	if _, err := e.copy.Exec(e.ctx, writerTable); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.config = filepath.Join(dir, "source.yaml")
	e.write(e.config, fmt.Sprintf(`http: {enabled: false}
input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: [{table: public.w, queue: %s, partition_by: key}]
    redis: {%s}
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue: {%s, durability: {replicas: 1, timeout: 2s}}
logger: {level: info}
shutdown_timeout: 20s
`, e.name, e.pg.DSN(), e.queue, connYAML, connYAML))
	e.sinkConf = filepath.Join(dir, "sink.yaml")
	e.write(e.sinkConf, fmt.Sprintf(`http: {enabled: false}
input:
  redis_queue: {%s, queue: %s, group: copy, batch_count: 64, lease_ttl: 3s}
output:
  pg_sink: {dsn: %q, name: copy, table: public.w, mode: cdc}
logger: {level: info}
shutdown_timeout: 20s
`, connYAML, e.queue, copyDSN))
	return e
}

func (e *failoverEnv) write(path, text string) {
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// startBoth starts the source and the sink processes and waits for the first pointer.
func (e *failoverEnv) startBoth() (source, sink *testenv.Process) {
	source = e.start()
	sink = testenv.StartProcess(e.t, nil, testenv.Binary(e.t), "-c", e.sinkConf)
	e.waitAcked("start", 0, 60*time.Second)
	return source, sink
}

// client is a new client of the Redis under test, closed when the test ends.
func (e *failoverEnv) client() redis.UniversalClient {
	rdb, err := e.redis.Client()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { rdb.Close() })
	return rdb
}

// freshPointer reads the source's pointer through a new client, so a read never waits for a stale
// view of the servers (nil while it cannot be read).
func (e *failoverEnv) freshPointer() *pointer.Pointer {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	rdb, err := e.redis.Client()
	if err != nil {
		return nil
	}
	defer rdb.Close()
	raw, err := rdb.Get(ctx, e.pointerKey()).Bytes()
	if err != nil {
		return nil
	}
	p, err := pointer.Parse(raw)
	if err != nil {
		return nil
	}
	return &p
}

// waitAcked waits up to bound for the pointer to be at or past lsn with no transaction half in,
// and returns how long that took (or fails the test).
func (e *failoverEnv) waitAcked(what string, lsn pglogrepl.LSN, bound time.Duration) time.Duration {
	e.t.Helper()
	start := time.Now()
	for {
		p := e.freshPointer()
		if p != nil && p.InTxn == nil && p.LSNValue() >= lsn {
			return time.Since(start)
		}
		if time.Since(start) > bound {
			e.t.Fatalf("%s: the pointer %+v does not cover %s after %s", what, p, lsn, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *failoverEnv) currentLSN() pglogrepl.LSN { return cdctest.CurrentLSN(e.t, e.pg.Pool()) }

// finish stops the writer, waits for the pointer to cover the last commit, and checks the queue
// with the replay oracle (every id once, contiguous offsets, equal to the table) and the sink's
// copy (equal to the table once the group has acked the whole queue). It also reads the group
// through `pgrelay queue info -c sink.yaml`.
func (e *failoverEnv) finish(stop chan struct{}, wait func() int) {
	e.t.Helper()
	close(stop)
	committed := wait()
	e.waitAcked("end", e.currentLSN(), 60*time.Second)
	rdb := e.client()
	entries, err := oracle.ReadQueue(e.ctx, rdb, "pgrelay", e.queue)
	if err != nil {
		e.t.Fatalf("read the queue: %v", err)
	}
	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		e.t.Errorf("queue: %s", p)
	}
	if res.Events != len(entries) || len(res.ByID) != len(entries) || len(entries) == 0 {
		e.t.Errorf("queue: %d entries, %d events, %d distinct ids", len(entries), res.Events, len(res.ByID))
	}
	rows, err := oracle.TableRows(e.ctx, e.conn(), "public.w", []string{"id"})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range oracle.Compare(res.Tables["public.w"], rows) {
		e.t.Errorf("queue vs table: %s", d)
	}
	cdctest.WaitEvery(e.t, 60*time.Second, 250*time.Millisecond, "the copy equal to the table", func() (bool, string) {
		info, err := queue.Inspect(e.ctx, rdb, queue.NewLayout("pgrelay"), e.queue)
		caughtUp := err == nil && len(info.Groups) == 1 && info.Groups[0].Lag == 0 && info.Groups[0].Pending == 0
		want, err1 := tableHashes(e.ctx, e.pg.Pool(), "w", "id")
		got, err2 := tableHashes(e.ctx, e.copy, "w", "id")
		diff := hashDiff(want, got)
		if caughtUp && err1 == nil && err2 == nil && len(diff) == 0 {
			e.t.Logf("%d transactions, %d queue entries, %d rows copied", committed, len(entries), len(got))
			return true, ""
		}
		return false, fmt.Sprintf("caught up %v (%v); %v %v %v", caughtUp, err, err1, err2, diff)
	})
	var cli queue.Info
	if err := json.Unmarshal([]byte(runCLI(e.tt, "queue", "info", "-c", e.sinkConf, "--json")), &cli); err != nil {
		e.t.Fatalf("queue info: %v", err)
	}
	if len(cli.Groups) != 1 || cli.Groups[0].Name != "copy" || cli.Groups[0].Lag != 0 || cli.Length != int64(len(entries)) {
		e.t.Errorf("queue info -c sink.yaml: %+v", cli)
	}
}

// TestClusterFailoverResumesWithinSeconds runs both pipelines on a 3-master + 3-replica Redis
// Cluster (cluster-node-timeout 2 s, appendfsync always) under a random writer, SIGKILLs the master
// holding the queue's slot, and restarts it once its replica is promoted (it rejoins as that
// replica's replica). Writes must be acknowledged again (the pointer covers the WAL position taken
// when the cluster is whole) within failoverAckBound, and at the end the queue and the sink's copy
// are exact: nothing lost, nothing repeated.
func TestClusterFailoverResumesWithinSeconds(t *testing.T) {
	rc := testenv.StartRedisCluster(t, testenv.WithClusterReplicas(1), testenv.WithNodeTimeout(2*time.Second))
	var urls []string
	for _, a := range rc.Addrs() {
		urls = append(urls, "redis://"+a)
	}
	e := newFailoverEnv(t, redisconn.Config{ClusterURLs: urls}, "cluster_urls: ["+strings.Join(urls, ", ")+"]")
	e.startBoth()
	stop := make(chan struct{})
	wait := e.randomWriter(41, stop)
	time.Sleep(2 * time.Second)

	master, replicas := rc.MasterOf(e.pointerKey())
	if master == nil || len(replicas) != 1 {
		t.Fatalf("the queue's slot: master %v, replicas %v", master, replicas)
	}
	killed := time.Now()
	master.Kill()
	for {
		if m, _ := rc.MasterOf(e.pointerKey()); m == replicas[0] {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("replica %s not promoted", replicas[0].Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	promoted := time.Since(killed)
	master.Restart()
	rc.WaitWhole(30 * time.Second)
	whole := time.Since(killed)
	acked := e.waitAcked("after the failover", e.currentLSN(), failoverAckBound)
	t.Logf("master %s SIGKILLed: replica promoted at +%.1fs, cluster whole at +%.1fs, writes acknowledged again %.1fs after that (goal 10 s)",
		master.Addr(), promoted.Seconds(), whole.Seconds(), acked.Seconds())
	time.Sleep(time.Second)
	e.finish(stop, wait)
}

// TestSentinelFailoverPipelinesStayExact runs both pipelines on a Sentinel-managed Redis (one
// master with appendfsync always, one replica, three sentinels) under a random writer. The master
// is SIGKILLed; once the sentinels have promoted the replica, the old master comes back as its
// replica (or, if the sentinels fail over again, whichever node they settle on has the other as its
// replica). Writes must be acknowledged again within failoverAckBound of that, and at the end the
// queue and the sink's copy are exact: nothing acknowledged lost, nothing applied twice.
func TestSentinelFailoverPipelinesStayExact(t *testing.T) {
	rs := testenv.StartRedisSentinel(t, 1)
	conn := redisconn.Config{Sentinel: &redisconn.Sentinel{MasterName: testenv.SentinelMaster, Addrs: rs.SentinelAddrs()}}
	e := newFailoverEnv(t, conn, fmt.Sprintf("sentinel: {master_name: %s, addresses: [%s]}", testenv.SentinelMaster, strings.Join(rs.SentinelAddrs(), ", ")))
	e.startBoth()
	stop := make(chan struct{})
	wait := e.randomWriter(42, stop)
	time.Sleep(2 * time.Second)

	master, replica := rs.Nodes[0], rs.Nodes[1]
	killed := time.Now()
	master.Kill()
	if p := rs.WaitPromoted(master, 30*time.Second); p != replica {
		t.Fatalf("promoted %s", p.Addr())
	}
	promoted := time.Since(killed)
	rs.Rejoin(master, replica)
	// whichever node the sentinels settle on, with its replica: on a loaded machine they may fail
	// the promoted replica over again, back to the old master
	rs.WaitSettled(30 * time.Second)
	whole := time.Since(killed)
	acked := e.waitAcked("after the failover", e.currentLSN(), failoverAckBound)
	t.Logf("master %s SIGKILLed: replica promoted at +%.1fs, old master its replica at +%.1fs, writes acknowledged again %.1fs after that (goal 10 s)",
		master.Addr(), promoted.Seconds(), whole.Seconds(), acked.Seconds())
	time.Sleep(time.Second)
	e.finish(stop, wait)

	// The CLI reaches the new master through the sentinels given as flags.
	args := []string{"queue", "info", "--json", "--sentinel-master", testenv.SentinelMaster}
	for _, a := range rs.SentinelAddrs() {
		args = append(args, "--sentinel", a)
	}
	var info queue.Info
	if err := json.Unmarshal([]byte(runCLI(t, append(args, e.queue)...)), &info); err != nil {
		t.Fatalf("queue info --sentinel: %v", err)
	}
	if info.Shards != 16 || len(info.Groups) != 1 || info.Groups[0].Lag != 0 {
		t.Errorf("queue info --sentinel: %+v", info)
	}
}
