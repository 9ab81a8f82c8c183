package source_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/benchenv/follow"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkStreamPgbench measures what streaming small transactions costs: PostgreSQL's own
// pgbench (TPC-B-like: three updates and an insert per transaction, `-c 4 -j 2`, no vacuum) runs
// at a fixed PGRELAY_BENCH_PGBENCH_TPS (2,000) for PGRELAY_BENCH_SECONDS (10; 3 in quick mode)
// while a pg_cdc source of its four tables (pgbench_history append-only) streams into
// redis_queue, as BenchmarkSnapshotUnderLoad's stream. The window runs from pgbench's start until
// the pointer passed the WAL's end at pgbench's exit (stream_catch_up_s: how long after the exit). In PGRELAY_BENCH_RUNS runs, each a new
// source, it reports the CPU per pgbench transaction of pgrelay (this process), redis-server, the
// walsender serving the slot (its decoding: the baseline) and the rest of PostgreSQL (pgbench's
// backends), the transactions per second pgbench reached and per queue write (Redis EXECs: the
// heartbeat's and the lease's few included). A last run follows the queue instead: the commit →
// queue latency of every event (its ts → a blocking XREAD returned it), p50 and p99. A fixed rate,
// not flat out, so the figures compare from build to build whatever the machine's other load.
func BenchmarkStreamPgbench(b *testing.B) {
	tps := benchenv.Size("PGRELAY_BENCH_PGBENCH_TPS", 2000, 2000)
	seconds := benchenv.Size("PGRELAY_BENCH_SECONDS", 10, 3)
	defer benchenv.RuntimeLikeBinary()()
	e := &env{t: b, pg: testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off")), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	pgbench, err := benchenv.PGClientBin(e.pg.BinDir, "pgbench")
	if err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(pgbench, "-i", "-q", "-s", "1", e.pg.DSN()).CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	lr := &loadRunner{e: e, pgbench: pgbench}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < benchenv.Runs(); r++ {
			lr.pgbenchRun(b, &m, fmt.Sprintf("pb%d_%d", i, r), tps, seconds, false)
		}
		lr.pgbenchRun(b, &m, fmt.Sprintf("pbl%d", i), tps, seconds, true)
		m.Report(b)
	}
}

// pgbenchRun is one run of BenchmarkStreamPgbench with a new source name: its CPU figures, or
// with latency its commit → queue latency alone (the reader's work would count as pgrelay's CPU).
func (lr *loadRunner) pgbenchRun(b *testing.B, m *benchenv.Metrics, name string, tps, seconds int, latency bool) {
	e := lr.e
	pids := benchPids(b, e)
	stop := startStream(b, lr.config(name, false))
	defer stop()
	e.waitPointer(name, name)
	ws, err := benchenv.WalsenderPid(e.ctx, e.pg.Pool(), "pgrelay_"+name)
	if err != nil || ws == 0 {
		b.Fatalf("no walsender for slot pgrelay_%s: %v", name, err)
	}
	var lat follow.Latencies
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	followed := make(chan struct{})
	if latency {
		rdb := e.rd.Client()
		defer rdb.Close()
		go func() {
			defer close(followed)
			follow.Queue(ctx, rdb, name, lat.Seen)
		}()
		time.Sleep(50 * time.Millisecond) // the follower has issued its first XREAD
	} else {
		close(followed)
	}
	tx0 := lr.historyRows(b)
	endProfile := func() {}
	if !latency {
		endProfile = benchenv.Profile(b, "pgbench_stream")
	}
	meter := startMeter(b, pids)
	w0, x0 := meter.cpu(benchenv.CPU, ws), lr.execs(b)
	t0 := time.Now()
	if out, err := exec.Command(lr.pgbench, "-n", "-c", "4", "-j", "2", "-R", strconv.Itoa(tps), "-T", strconv.Itoa(seconds), e.pg.DSN()).CombinedOutput(); err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	ran := time.Since(t0)
	// one more transaction after the last of pgbench's: once the pointer passed the WAL's end,
	// every pgbench transaction is in the queue
	end := currentLSN(b, e)
	e.pg.Exec(`INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 0, now())`)
	for e.pointerLSN(name) < end {
		time.Sleep(5 * time.Millisecond)
	}
	ph := meter.end()
	ph.walsender = meter.cpu(benchenv.CPU, ws) - w0
	writes := lr.execs(b) - x0
	endProfile()
	n := int(lr.historyRows(b) - tx0)
	if latency {
		time.Sleep(300 * time.Millisecond) // the follower's last XREAD
		cancel()
		<-followed
		if lat.Len() == 0 {
			b.Fatal("no events followed")
		}
		m.Add("stream_p50_ms", ms(lat.Percentile(0.50)))
		m.Add("stream_p99_ms", ms(lat.Percentile(0.99)))
		return
	}
	m.Add("stream_tx/s", float64(n)/ran.Seconds())
	m.Add("stream_catch_up_s", (ph.elapsed - ran).Seconds())
	m.Add("stream_cpu_pgrelay_us/tx", benchenv.PerChange(ph.pgrelay, n))
	m.Add("stream_cpu_redis_us/tx", benchenv.PerChange(ph.redis, n))
	m.Add("stream_cpu_walsender_us/tx", benchenv.PerChange(ph.walsender, n))
	m.Add("stream_cpu_postgres_other_us/tx", benchenv.PerChange(ph.postgres-ph.walsender, n))
	m.Add("stream_vs_walsender_ratio", float64(ph.walsender)/float64(ph.pgrelay))
	m.Add("stream_tx/write", float64(n)/float64(max(writes, 1)))
	addAlloc(m, "stream", "tx", ph, n)
}
