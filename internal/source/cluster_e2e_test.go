package source_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// clusterEnv is env with a 3-master Redis Cluster instead of a single Redis.
type clusterEnv struct {
	t   *testing.T
	ctx context.Context
	pg  *testenv.Postgres
	rc  *testenv.RedisCluster
	cc  *redis.ClusterClient
	out string // further redis_queue fields of the pipelines
}

// clusterSource is one pg_cdc source and the one queue (and table) it feeds.
type clusterSource struct {
	name, table, queue string
	master             string // address of the master serving the queue's slot
}

func newClusterEnv(t *testing.T) *clusterEnv {
	t.Parallel() // servers of its own, as newEnv
	rc := testenv.StartRedisCluster(t)
	return &clusterEnv{t: t, ctx: context.Background(), pg: testenv.StartPostgres(t), rc: rc, cc: rc.Client(t)}
}

// run starts pg_cdc → redis_queue with both Redis connections on the cluster.
func (e *clusterEnv) run(name, tables string) func() {
	e.t.Helper()
	return startStream(e.t, e.yaml(name, tables))
}

func (e *clusterEnv) yaml(name, tables string) string {
	var urls []string
	for _, a := range e.rc.Addrs() {
		urls = append(urls, "redis://"+a)
	}
	return cdctest.Pipeline{Name: name, DSN: e.pg.DSN(), Tables: tables, ClusterURLs: urls, Durability: "aof", Output: e.out}.YAML()
}

func (s clusterSource) tables() string {
	return fmt.Sprintf(`[{table: %s, queue: %s, partition_by: key}]`, s.table, s.queue)
}

// queuesOnTwoMasters returns two queue names whose hash tags are served by different masters,
// with those masters' addresses (asked of the cluster, not computed here).
func (e *clusterEnv) queuesOnTwoMasters() (a, b clusterSource) {
	e.t.Helper()
	for i := 0; i < 100; i++ {
		q := fmt.Sprintf("orders%d", i)
		node, err := e.cc.MasterForKey(e.ctx, "pgrelay:{"+q+"}:meta")
		if err != nil {
			e.t.Fatalf("master of %s: %v", q, err)
		}
		addr := node.Options().Addr
		switch {
		case a.queue == "":
			a = clusterSource{queue: q, master: addr}
		case addr != a.master:
			return a, clusterSource{queue: q, master: addr}
		}
	}
	e.t.Fatal("no two queues on different masters")
	return
}

// pointer reads a source's pointer through the cluster client (nil while there is none).
func (e *clusterEnv) pointer(s clusterSource) *pointer.Pointer {
	return cdctest.ReadPointer(e.t, e.cc, s.queue, s.name)
}

// waitCovered waits until the source's pointer is at or past lsn with no transaction half in:
// every transaction committed before lsn is then in the queue.
func (e *clusterEnv) waitCovered(s clusterSource, lsn pglogrepl.LSN) {
	e.t.Helper()
	cdctest.WaitCovered(e.t, 45*time.Second, cdctest.DefaultPoll, lsn, func() *pointer.Pointer { return e.pointer(s) })
}

func (e *clusterEnv) currentLSN() pglogrepl.LSN { return cdctest.CurrentLSN(e.t, e.pg.Pool()) }

// waitStreaming waits until the source's status hash (read through the cluster) shows phase streaming.
func (e *clusterEnv) waitStreaming(s clusterSource) {
	e.t.Helper()
	cdctest.WaitStatus(e.t, 30*time.Second, e.cc, s.queue, s.name, `"phase":"streaming"`)
}

func (e *clusterEnv) conn() *pgx.Conn { return cdctest.Conn(e.t, e.pg.DSN()) }

// checkQueue reads the source's queue back through the cluster and checks with the replay oracle
// that it replays to the table exactly (every id once, contiguous offsets, lsn order per partition),
// that it holds only that table, and that the queue has the default 16 shards.
func (e *clusterEnv) checkQueue(s clusterSource) *oracle.Result {
	e.t.Helper()
	if n, err := e.cc.HGet(e.ctx, "pgrelay:{"+s.queue+"}:meta", "shards").Result(); err != nil || n != "16" {
		e.t.Errorf("queue %s: shards %q (%v), want the default 16", s.queue, n, err)
	}
	entries, err := oracle.ReadQueue(e.ctx, e.cc, "pgrelay", s.queue)
	if err != nil {
		e.t.Fatalf("read %s: %v", s.queue, err)
	}
	res := oracle.Replay(entries)
	for _, p := range res.Problems {
		e.t.Errorf("queue %s: %s", s.queue, p)
	}
	if res.Events != len(entries) || len(res.ByID) != len(entries) {
		e.t.Errorf("queue %s: %d entries, %d events, %d distinct ids", s.queue, len(entries), res.Events, len(res.ByID))
	}
	full := "public." + s.table
	for tbl := range res.Tables {
		if tbl != full {
			e.t.Errorf("queue %s holds events of %s", s.queue, tbl)
		}
	}
	rows, err := oracle.TableRows(e.ctx, e.conn(), full, []string{"id"})
	if err != nil {
		e.t.Fatalf("rows of %s: %v", full, err)
	}
	for _, d := range oracle.Compare(res.Tables[full], rows) {
		e.t.Errorf("queue %s vs %s: %s", s.queue, full, d)
	}
	e.t.Logf("queue %s on %s: %d entries, %d rows", s.queue, s.master, len(entries), len(rows))
	return res
}

// checkKeyPlacement proves DESIGN §4 on the cluster: the source's lease, pointer and status keys
// hash to its queue's slot (CLUSTER KEYSLOT), and that slot's master physically holds them next to
// the queue's meta and shard streams (CLUSTER GETKEYSINSLOT on that node's own connection).
func (e *clusterEnv) checkKeyPlacement(s clusterSource) {
	e.t.Helper()
	meta := "pgrelay:{" + s.queue + "}:meta"
	slot, err := e.cc.ClusterKeySlot(e.ctx, meta).Result()
	if err != nil {
		e.t.Fatalf("keyslot %s: %v", meta, err)
	}
	own := []string{cdctest.SourceKey(s.queue, s.name, "lease"), cdctest.SourceKey(s.queue, s.name, "ptr"), cdctest.SourceKey(s.queue, s.name, "status")}
	for _, k := range own {
		if ks, err := e.cc.ClusterKeySlot(e.ctx, k).Result(); err != nil || ks != slot {
			e.t.Errorf("%s: slot %d (%v), the queue's is %d", k, ks, err, slot)
		}
		if node, err := e.cc.MasterForKey(e.ctx, k); err != nil || node.Options().Addr != s.master {
			e.t.Errorf("%s: master %v (%v), the queue's is %s", k, node, err, s.master)
		}
	}
	var holder *testenv.Redis
	for _, n := range e.rc.Nodes {
		if n.Addr() == s.master {
			holder = n
		}
	}
	if holder == nil {
		e.t.Fatalf("no node %s", s.master)
	}
	keys, err := holder.Client().ClusterGetKeysInSlot(e.ctx, int(slot), 1000).Result()
	if err != nil {
		e.t.Fatalf("GETKEYSINSLOT %d on %s: %v", slot, s.master, err)
	}
	for _, k := range append(own, meta) {
		if !slices.Contains(keys, k) {
			e.t.Errorf("master %s, slot %d lacks %s (has %v)", s.master, slot, k, keys)
		}
	}
	streams := 0
	for _, k := range keys {
		if strings.HasPrefix(k, "pgrelay:{"+s.queue+"}:s:") {
			streams++
		}
	}
	if streams == 0 {
		e.t.Errorf("master %s, slot %d holds no shard stream of %s: %v", s.master, slot, s.queue, keys)
	}
}

// waitClusterOK waits until every node reports cluster_state:ok again.
func (e *clusterEnv) waitClusterOK() {
	e.t.Helper()
	clients := map[*testenv.Redis]*redis.Client{}
	for _, n := range e.rc.Nodes {
		clients[n] = n.Client()
	}
	cdctest.Wait(e.t, 30*time.Second, "every node to report cluster_state:ok", func() (bool, string) {
		for _, n := range e.rc.Nodes {
			info, err := clients[n].ClusterInfo(e.ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, fmt.Sprintf("node %s: %v %s", n.Addr(), err, info)
			}
		}
		return true, ""
	})
}

// clusterWriter runs cdctest.RandomTx over tables from two connections until stop (each
// statement on a random table, so one transaction often spans both sources); wait returns the
// number of committed transactions.
func (e *clusterEnv) clusterWriter(seed uint64, tables []string, stop <-chan struct{}) (wait func() int) {
	return cdctest.Writers(seed, 2, 3, stop, func(rng *rand.Rand) bool { return cdctest.RandomTx(e.ctx, e.pg.Pool(), rng, tables...) })
}

// twoSources creates tables wa and wb and starts one source per table, each with its own queue,
// the two queues on different masters; it returns once both stream.
func (e *clusterEnv) twoSources() (a, b clusterSource, stopA, stopB func()) {
	e.t.Helper()
	a, b = e.queuesOnTwoMasters()
	a.name, a.table = "ca", "wa"
	b.name, b.table = "cb", "wb"
	e.pg.Exec(`CREATE TABLE wa ` + cdctest.WriterColumns + `; CREATE TABLE wb ` + cdctest.WriterColumns)
	stopA = e.run(a.name, a.tables())
	stopB = e.run(b.name, b.tables())
	e.waitStreaming(a)
	e.waitStreaming(b)
	return a, b, stopA, stopB
}

// TestClusterTwoSourcesOnTwoMastersAreExact runs two pg_cdc sources at once (one per table and
// queue, the queues' slots on different masters) with Redis Cluster for both the source's keys and
// redis_queue, under a random writer whose transactions often span both tables. Once the writer
// stops and each pointer covers pg_current_wal_lsn(), replaying each queue equals its table with
// every id once (16 shards, partition by key); each source's lease, pointer and status keys live in
// its queue's slot, on the master that holds the queue's streams.
func TestClusterTwoSourcesOnTwoMastersAreExact(t *testing.T) {
	e := newClusterEnv(t)
	a, b, _, _ := e.twoSources()
	stop := make(chan struct{})
	wait := e.clusterWriter(11, []string{a.table, b.table}, stop)
	time.Sleep(4 * time.Second)
	close(stop)
	committed := wait()
	end := e.currentLSN()
	e.waitCovered(a, end)
	e.waitCovered(b, end)
	// Both sources still run: the lease exists, so all three keys can be located.
	e.checkKeyPlacement(a)
	e.checkKeyPlacement(b)
	ra, rb := e.checkQueue(a), e.checkQueue(b)
	if ra.Events == 0 || rb.Events == 0 {
		t.Errorf("a queue stayed empty: %d and %d events", ra.Events, rb.Events)
	}
	t.Logf("%d transactions", committed)
}

// TestClusterSourcesStayExactOverRestartAndMasterKill is the same two-source run, but midway
// source A's pipeline is stopped and a new one of the same name started, and later the master
// serving queue B's slot is SIGKILLed and restarted on its data (appendfsync always, durability: aof).
// The outputs write two batches at a time (max_in_flight 2, each source's batches chained on one
// connection). Each queue must still replay to its table with every id once.
func TestClusterSourcesStayExactOverRestartAndMasterKill(t *testing.T) {
	e := newClusterEnv(t)
	e.out = "max_in_flight: 2"
	a, b, stopA, _ := e.twoSources()
	stop := make(chan struct{})
	wait := e.clusterWriter(12, []string{a.table, b.table}, stop)
	time.Sleep(1500 * time.Millisecond)
	stopA()
	e.run(a.name, a.tables())
	time.Sleep(1500 * time.Millisecond)
	var master *testenv.Redis
	for _, n := range e.rc.Nodes {
		if n.Addr() == b.master {
			master = n
		}
	}
	master.Kill()
	time.Sleep(time.Second)
	master.Restart()
	e.waitClusterOK()
	time.Sleep(2 * time.Second)
	close(stop)
	committed := wait()
	end := e.currentLSN()
	e.waitCovered(a, end)
	e.waitCovered(b, end)
	ra, rb := e.checkQueue(a), e.checkQueue(b)
	if ra.Events == 0 || rb.Events == 0 {
		t.Errorf("a queue stayed empty: %d and %d events", ra.Events, rb.Events)
	}
	t.Logf("%d transactions", committed)
}

// TestClusterSourceOverTwoSlotsIsRefused proves that one source whose tables go to queues in
// different cluster slots (so its pointer could not be written in the same script as both queues)
// is refused at start with code cluster_slot naming the fix, before it touches PostgreSQL or Redis.
func TestClusterSourceOverTwoSlotsIsRefused(t *testing.T) {
	e := newClusterEnv(t)
	a, b := e.queuesOnTwoMasters()
	e.pg.Exec(`CREATE TABLE wa (id int PRIMARY KEY); CREATE TABLE wb (id int PRIMARY KEY)`)
	conf := e.yaml("both", fmt.Sprintf(`[{table: wa, queue: %s}, {table: wb, queue: %s}]`, a.queue, b.queue))
	// The linter refuses it already; the start must refuse it too, for configs run without lint.
	if err := service.NewStreamBuilder().SetYAML(conf); err == nil || !strings.Contains(err.Error(), "cluster_slot") {
		t.Fatalf("lint of a source over two slots: %v", err)
	}
	sb := service.NewStreamBuilder()
	sb.DisableLinting()
	if err := sb.SetYAML(conf); err != nil {
		t.Fatal(err)
	}
	stream, err := sb.Build()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	err = stream.Run(ctx)
	if !errcode.Is(err, errcode.ClusterSlot) || !strings.Contains(err.Error(), "tables[1].queue") ||
		!strings.Contains(err.Error(), "Fix: ") || !strings.Contains(err.Error(), "one source per queue") {
		t.Fatalf("a source over two slots: %v", err)
	}
	t.Logf("refused: %v", err)
	var objects int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgrelay_both')
		+ (SELECT count(*) FROM pg_publication WHERE pubname = 'pgrelay_both')`).Scan(&objects); err != nil {
		t.Fatal(err)
	}
	if objects != 0 {
		t.Errorf("the refused source created %d slot/publication", objects)
	}
	for _, q := range []string{a.queue, b.queue} {
		for _, what := range []string{"lease", "ptr", "status"} {
			if n := e.cc.Exists(e.ctx, cdctest.SourceKey(q, "both", what)).Val(); n != 0 {
				t.Errorf("the refused source wrote %s", cdctest.SourceKey(q, "both", what))
			}
		}
	}
}
