package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/snapshot"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkSnapshotUnderLoad measures the snapshot's share of the pipeline while PostgreSQL's own
// pgbench (TPC-B-like, `-c 4 -j 2`, no vacuum, flat out) writes the other tables of the same
// source. Each run is a new pg_cdc source of pgbench's four tables (pgbench_history append-only)
// into redis_queue that is restarted with a separate table of PGRELAY_BENCH_LOAD_SNAPSHOT_ROWS
// rows (300,000; 20,000 in quick mode, rows as BenchmarkSnapshot's) added, which it snapshots
// while it streams. In PGRELAY_BENCH_RUNS alternating runs:
//
//   - idle: no writers; the snapshot's time from the restart to the pointer's snapshot becoming
//     null, and its pace (rows per second over that time);
//   - steady: pgbench runs from before the restart to the end: the snapshot's time (goal: at most
//     2× idle's) and the stream's lag throughout the snapshot, once the stream first caught up
//     after the restart (goal: under 2 s). The lag is the age of the newest delivered commit: the
//     time since the WAL's end was last at or below the pointer's LSN (sampled every 50 ms, so it
//     is an upper bound);
//   - catchup: as steady, but the source is stopped once a third of the table is delivered and
//     restarted PGRELAY_BENCH_LOAD_BACKLOG seconds later (10; 3 in quick mode) with the writers
//     running all along, so the stream starts behind by that backlog: the snapshot's pace from the
//     restart to the end, over the rows left (goal: at least a third of idle's pace, from its start
//     to its end); and where that time goes: catchup_first_chunk_s, from the restart to the first
//     rows delivered after it (the chunks read at the restart lie where the WAL ended then, behind
//     the backlog, so this is about the time the stream took to work it off), and
//     catchup_after_first_rows/s, the pace from there to the end. The stop is a clean one (in-process pipelines cannot be SIGKILLed), which
//     releases the lease: no lease wait to leave out; what the restart finds (the pointer's
//     cursor, the backlog in the slot) is what it finds after a kill.
//
// It reports the medians: the times and paces, steady_slowdown (steady ÷ idle time),
// catchup_ratio (catchup ÷ idle pace), the lag, the writers' transactions per second, the queue
// writes per second (Redis EXECs, idle and steady: the stream's batches beside the chunks'), and the
// cores each process used in idle and steady (its CPU time over the snapshot's time: pgrelay,
// redis-server, the whole PostgreSQL server with pgbench's backends, and pgbench itself; under a
// share of the cores it gets, the snapshot waits on something other than the CPU).
func BenchmarkSnapshotUnderLoad(b *testing.B) {
	defer benchenv.RuntimeLikeBinary()()
	total := benchenv.Size("PGRELAY_BENCH_LOAD_SNAPSHOT_ROWS", 300000, 20000)
	backlog := time.Duration(benchenv.Size("PGRELAY_BENCH_LOAD_BACKLOG", 10, 3)) * time.Second
	runs := benchenv.Runs()
	e := &env{t: b, pg: testenv.StartPostgres(b), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	pgbench, err := benchenv.PGClientBin(e.pg.BinDir, "pgbench")
	if err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(pgbench, "-i", "-q", "-s", "1", e.pg.DSN()).CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	e.pg.Exec(`CREATE TABLE snap (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	e.pg.Exec(`INSERT INTO snap SELECT g, repeat(md5(g::text), 3), g * 1.5, now() FROM generate_series(1, $1::bigint) g`, total)
	e.pg.Exec(`VACUUM ANALYZE snap`)
	e.pg.Exec(`CHECKPOINT`)
	lr := &loadRunner{e: e, pgbench: pgbench, total: total, backlog: backlog}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < runs; r++ {
			idle := lr.run(b, fmt.Sprintf("li%d_%d", i, r), false, false)
			steady := lr.run(b, fmt.Sprintf("ls%d_%d", i, r), true, false)
			catchup := lr.run(b, fmt.Sprintf("lc%d_%d", i, r), true, true)
			m.Add("idle_s", idle.elapsed.Seconds())
			m.Add("idle_rows/s", idle.pace)
			idle.addCores(&m, "idle")
			m.Add("idle_cpu_pgrelay_us/row", idle.cpu.pgrelay.Seconds()*1e6/float64(total))
			m.Add("steady_s", steady.elapsed.Seconds())
			steady.addCores(&m, "steady")
			// pgrelay's CPU over the snapshot, the stream of pgbench's changes included: the
			// slowdown is this against idle's times the cores pgrelay got against idle's
			m.Add("steady_stream_pgrelay_cores", steady.streamCores)
			if steady.writersTPS > 0 {
				m.Add("steady_stream_pgrelay_us/tx", steady.streamCores*1e6/steady.writersTPS)
			}
			m.Add("steady_cpu_pgrelay_us/row", steady.cpu.pgrelay.Seconds()*1e6/float64(total))
			m.Add("steady_slowdown", steady.elapsed.Seconds()/idle.elapsed.Seconds())
			m.Add("idle_writes/s", float64(idle.writes)/idle.window.Seconds())
			m.Add("steady_writes/s", float64(steady.writes)/steady.window.Seconds())
			if idle.own > 0 && steady.own > 0 {
				m.Add("idle_own_s", idle.own.Seconds())
				m.Add("steady_own_s", steady.own.Seconds())
				m.Add("steady_own_slowdown", steady.own.Seconds()/idle.own.Seconds())
			}
			m.Add("steady_lag_max_s", steady.lagMax.Seconds())
			m.Add("steady_writers_tx/s", steady.writersTPS)
			m.Add("catchup_rows/s", catchup.pace)
			m.Add("catchup_ratio", catchup.pace/idle.pace)
			m.Add("catchup_writers_tx/s", catchup.writersTPS)
			m.Add("catchup_first_chunk_s", catchup.firstChunk.Seconds())
			m.Add("catchup_after_first_rows/s", catchup.paceAfter)
			catchup.addCores(&m, "catchup")
		}
		m.Report(b)
	}
}

// loadRunner runs the snapshots of BenchmarkSnapshotUnderLoad.
type loadRunner struct {
	e       *env
	pgbench string
	total   int
	backlog time.Duration
	rdb     *redis.Client // execs' connection
}

// execs is the queue writes Redis has run so far (its EXEC calls: one per batch the output wrote),
// read on one connection the runner keeps.
func (lr *loadRunner) execs(b *testing.B) int64 {
	if lr.rdb == nil {
		lr.rdb = lr.e.rd.Client() // closed with the test
	}
	n, err := benchenv.RedisCalls(lr.e.ctx, lr.rdb, "exec")
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// loadResult is one snapshot under (or without) load.
type loadResult struct {
	elapsed     time.Duration // from the restart with the table added to the snapshot's end
	pace        float64       // rows per second from the (last) start to the end
	lagMax      time.Duration // steady: the stream's largest lag once it caught up after the restart
	writersTPS  float64
	window      time.Duration            // the pace's window: from the (last) start to the end
	cpu         phase                    // the CPU time of each process over window
	pgbench     time.Duration            // pgbench's own CPU time over the same window
	waits       map[string]time.Duration // per process: its threads' time runnable without a core
	own         time.Duration            // the snapshot's own time: its "snapshot of" log line to "snapshot done" (the last start's)
	streamCores float64                  // the cores pgrelay used streaming pgbench's changes before the restart
	writes      int64                    // the queue writes (Redis EXECs) over window
	firstChunk  time.Duration            // catchup: from the restart to the first rows delivered after it
	paceAfter   float64                  // catchup: rows per second from those rows to the end
}

// addCores reports the cores each process used over the snapshot's time.
func (r loadResult) addCores(m *benchenv.Metrics, name string) {
	s := r.window.Seconds()
	m.Add(name+"_pgrelay_cores", r.cpu.pgrelay.Seconds()/s)
	m.Add(name+"_redis_cores", r.cpu.redis.Seconds()/s)
	m.Add(name+"_postgres_cores", r.cpu.postgres.Seconds()/s)
	if r.pgbench > 0 {
		m.Add(name+"_pgbench_cores", r.pgbench.Seconds()/s)
	}
	for proc, d := range r.waits {
		m.Add(name+"_waiting_"+proc+"_cores", d.Seconds()/s)
	}
}

// waitWatch reads the run-queue waits of the benchmark's processes at a window's start.
type waitWatch struct {
	procs map[string][]int
	start map[string]benchenv.Waits
}

func startWaits(pids benchProcs, pgbench int) *waitWatch {
	w := &waitWatch{procs: map[string][]int{
		"pgrelay":  {os.Getpid()},
		"redis":    {pids.redis},
		"postgres": append([]int{pids.postmaster}, testenv.Descendants(pids.postmaster)...),
	}, start: map[string]benchenv.Waits{}}
	if pgbench != 0 {
		w.procs["pgbench"] = []int{pgbench}
	}
	for name, p := range w.procs {
		w.start[name] = benchenv.ReadWaits(p...)
	}
	return w
}

// end is each process' wait since the start (PostgreSQL: the backends alive at the end).
func (w *waitWatch) end(pids benchProcs) map[string]time.Duration {
	w.procs["postgres"] = append([]int{pids.postmaster}, testenv.Descendants(pids.postmaster)...)
	out := map[string]time.Duration{}
	for name, p := range w.procs {
		out[name] = w.start[name].Since(p...)
	}
	return out
}

func (lr *loadRunner) config(name string, added bool) string {
	tables := "[{table: pgbench_accounts, queue: %[1]s}, {table: pgbench_branches, queue: %[1]s}, {table: pgbench_tellers, queue: %[1]s}, {table: pgbench_history, queue: %[1]s, append_only: true, partition_by: [tid]}]"
	snap := "snapshot: never\nmetadata: false\n" + os.Getenv("PGRELAY_BENCH_SOURCE_EXTRA") // as config/pg_cdc_redis_queue.yaml
	if added {
		tables = tables[:len(tables)-1] + ", {table: snap, queue: %[1]s}]"
		snap = "snapshot: initial\nmetadata: false\n" + os.Getenv("PGRELAY_BENCH_SOURCE_EXTRA") + "\n" + os.Getenv("PGRELAY_BENCH_SNAPSHOT_EXTRA")
	}
	return fmt.Sprintf("input:\n  pg_cdc:\n    name: %[1]s\n    dsn: %[2]s\n    tls: {mode: disable}\n    tables: %[3]s\n    redis: {url: %[4]s}\n    lease_ttl: 3s\n%[5]s\noutput:\n  redis_queue:\n    url: %[4]s\n    durability: %[6]s%[7]s\nlogger:\n  level: warn\n",
		name, lr.e.pg.DSN(), fmt.Sprintf(tables, name), lr.e.rd.URL(), indent(snap), benchDurability(), benchOutputExtra())
}

// run makes source name stream pgbench's tables, starts the writers when asked, restarts the
// source with the snapshot table added and waits for its snapshot to end (stopping and restarting
// it a third of the way when kill is set).
func (lr *loadRunner) run(b *testing.B, name string, writers, kill bool) loadResult {
	e := lr.e
	pids := benchPids(b, e)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	stop := startStream(b, lr.config(name, false))
	e.waitPointer(name, name)
	key := "pgrelay:{" + name + "}:src:" + name + ":ptr"
	var res loadResult
	var tx0 int64
	t0 := time.Now()
	pgbenchPid := 0
	if writers {
		tx0 = lr.historyRows(b)
		cmd := exec.CommandContext(ctx, lr.pgbench, "-n", "-c", "4", "-j", "2", "-T", "3600", e.pg.DSN())
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		pgbenchPid = cmd.Process.Pid
		defer func() { cancel(); _ = cmd.Wait() }()
		c0, t1 := benchenv.SelfCPU(), time.Now()
		endStreamProfile := benchenv.Profile(b, "load_stream")
		time.Sleep(2 * time.Second) // the stream in its steady state
		endStreamProfile()
		res.streamCores = (benchenv.SelfCPU() - c0).Seconds() / time.Since(t1).Seconds()
	}
	stop()
	var lag *lagWatch
	if writers && !kill {
		lag = startLagWatch(ctx, e, key)
	}
	meter := startMeter(b, pids)
	waits := startWaits(pids, pgbenchPid)
	writes0 := lr.execs(b)
	start := meter.start
	var pgbench0 time.Duration
	if pgbenchPid != 0 {
		pgbench0 = meter.cpu(benchenv.CPU, pgbenchPid)
	}
	phaseName := "idle"
	switch {
	case kill:
		phaseName = "catchup"
	case writers:
		phaseName = "steady"
	}
	endProfile := benchenv.Profile(b, "load_"+phaseName)
	defer endProfile()
	marks := &snapshotMarks{}
	stop = runStream(b, lr.config(name, true), slog.New(marks))
	defer func() { stop() }()
	from, paceStart := int64(0), start // the pace's window: rows delivered at its start, its start
	stopped := false
	var moved time.Time // catchup: when the first rows after the restart were delivered
	var movedRows int64
	deadline := time.Now().Add(30 * time.Minute)
	for {
		p, err := source.ReadPointer(e.ctx, e.rd.Client(), key)
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		if p != nil && slices.Contains(p.Tables, "public.snap") {
			if string(p.Snapshot) == "null" {
				res.elapsed = now.Sub(start)
				res.cpu = meter.end()
				res.waits = waits.end(pids)
				res.writes = lr.execs(b) - writes0
				if pgbenchPid != 0 {
					res.pgbench = meter.cpu(benchenv.CPU, pgbenchPid) - pgbench0
				}
				res.window = now.Sub(paceStart)
				endProfile()
				res.own = marks.own()
				res.pace = float64(int64(lr.total)-from) / res.window.Seconds()
				if stopped {
					if moved.IsZero() { // the rest went in one step
						moved, movedRows = now, from
					}
					res.firstChunk = moved.Sub(paceStart)
					if d := now.Sub(moved).Seconds(); d > 0 {
						res.paceAfter = float64(int64(lr.total)-movedRows) / d
					}
				}
				break
			}
			var cur snapshot.Cursor
			if err := json.Unmarshal(p.Snapshot, &cur); err != nil {
				b.Fatal(err)
			}
			if stopped && moved.IsZero() && cur.Rows > from {
				moved, movedRows = now, cur.Rows
			}
			if kill && !stopped && cur.Rows >= int64(lr.total/3) {
				stopped = true
				stop()
				if p, err = source.ReadPointer(e.ctx, e.rd.Client(), key); err != nil {
					b.Fatal(err)
				}
				if err := json.Unmarshal(p.Snapshot, &cur); err != nil {
					b.Fatal(err)
				}
				time.Sleep(lr.backlog)
				from, paceStart = cur.Rows, time.Now()
				meter = startMeter(b, pids) // the catch-up's cores: from the restart
				waits = startWaits(pids, pgbenchPid)
				writes0 = lr.execs(b)
				pgbench0 = meter.cpu(benchenv.CPU, pgbenchPid)
				marks = &snapshotMarks{}
				stop = runStream(b, lr.config(name, true), slog.New(marks))
			}
		}
		if now.After(deadline) {
			b.Fatalf("snapshot %s not done", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if lag != nil {
		res.lagMax = lag.stop()
	}
	if writers {
		res.writersTPS = float64(lr.historyRows(b)-tx0) / time.Since(t0).Seconds()
	}
	return res
}

// historyRows counts pgbench_history's rows: one per pgbench transaction.
func (lr *loadRunner) historyRows(b *testing.B) int64 {
	var n int64
	if err := lr.e.pg.Pool().QueryRow(lr.e.ctx, `SELECT count(*) FROM pgbench_history`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// lagWatch samples the WAL's end and the pointer every 50 ms. The stream's lag at a sample is the
// time since the latest sample whose WAL end was at or below the pointer's LSN (every commit up to
// there is delivered). The largest lag counts from the first sample where it is under 1 s: the
// stream caught up with the restart's gap.
type lagWatch struct {
	mu      sync.Mutex
	caught  bool
	max     time.Duration
	samples []lagSample
	done    chan struct{}
	stopped chan struct{}
}

type lagSample struct {
	at  time.Time
	wal pglogrepl.LSN
}

func startLagWatch(ctx context.Context, e *env, key string) *lagWatch {
	w := &lagWatch{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var s string
			if err := e.pg.Pool().QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
				continue
			}
			now := time.Now()
			wal, _ := pglogrepl.ParseLSN(s)
			p, err := source.ReadPointer(ctx, e.rd.Client(), key)
			if err != nil || p == nil {
				continue
			}
			ptr := p.LSNValue()
			w.mu.Lock()
			w.samples = append(w.samples, lagSample{at: now, wal: wal})
			lag, known := now.Sub(w.samples[0].at), false // behind every sample: at least this
			for i := len(w.samples) - 1; i >= 0; i-- {
				if w.samples[i].wal <= ptr {
					lag, known = now.Sub(w.samples[i].at), true
					w.samples = w.samples[i:] // older samples are not needed again
					break
				}
			}
			if known && lag < time.Second {
				w.caught = true
			}
			if w.caught && lag > w.max {
				w.max = lag
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// stop ends the sampling and returns the largest lag once caught up (or the last lag when the
// stream never caught up).
func (w *lagWatch) stop() time.Duration {
	close(w.done)
	<-w.stopped
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.caught && len(w.samples) > 0 {
		return time.Since(w.samples[0].at)
	}
	return w.max
}
