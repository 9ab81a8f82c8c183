package source_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkSnapshot measures, in PGRELAY_BENCH_RUNS alternating runs on the same table of
// PGRELAY_BENCH_SNAPSHOT_ROWS rows (300,000; 20,000 in quick mode) of about 200 bytes as JSON:
//
//   - copy: `COPY (SELECT ...) TO STDOUT` drained to nowhere (PostgreSQL printing the rows);
//   - queue: pg_cdc's snapshot into redis_queue, from the start of the pipeline to the pointer's
//     snapshot becoming null (default chunk_rows and bundle limits, metadata: false as
//     config/pg_cdc_redis_queue.yaml ships it; PGRELAY_BENCH_SNAPSHOT_EXTRA adds pg_cdc fields);
//     queue2 the same with max_in_flight 2; queuemeta with pg_cdc's metadata on every message
//     (metadata: true, the default);
//   - drop: the same snapshot into the drop output (the source alone); also timed from the
//     snapshot's start (pg_cdc connected, its slot and lease held: its "snapshot of" log line) to
//     its end ("snapshot done"), like the COPY on a connection already open;
//   - xadd: the snapshot's entries XADDed again in plain pipelines of 1,000 (the Redis ceiling);
//   - multi: the same in MULTI/EXEC pipelines of 1,000 (see rawXAdd).
//
// PGRELAY_BENCH_SNAPSHOT_ONLY=drop runs copy and drop alone (profiling the source).
//
// It reports the medians of the rates, the ratios (drop and queue to COPY, queue to xadd) and
// the CPU time per row of pgrelay (this process), redis-server, the COPY's backend, the walsender
// and the PostgreSQL backends reading the chunks (the whole server but the walsender).
func BenchmarkSnapshot(b *testing.B) {
	total := benchenv.Size("PGRELAY_BENCH_SNAPSHOT_ROWS", 300000, 20000)
	runs := benchenv.Runs()
	defer benchenv.RuntimeLikeBinary()()
	e := &env{t: b, pg: testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off")),
		rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	pids := benchPids(b, e)
	e.pg.Exec(`CREATE TABLE snap (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	e.pg.Exec(`INSERT INTO snap SELECT g, repeat(md5(g::text), 3), g * 1.5, now() FROM generate_series(1, $1::bigint) g`, total)
	e.pg.Exec(`VACUUM ANALYZE snap`)
	e.pg.Exec(`CHECKPOINT`)
	conn, err := pgconn.Connect(e.ctx, e.pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(e.ctx)
	copyPid := int(conn.PID())
	dropOnly := os.Getenv("PGRELAY_BENCH_SNAPSHOT_ONLY") == "drop"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < runs; r++ {
			c0 := cpuOf(b, copyPid)
			mt := startMeter(b, pids)
			if _, err := conn.CopyTo(e.ctx, io.Discard, `COPY (SELECT id, v, n, ts FROM snap ORDER BY id) TO STDOUT`); err != nil {
				b.Fatal(err)
			}
			cp := mt.end()
			cp.postgres = cpuOf(b, copyPid) - c0
			m.Add("copy_rows/s", cp.rate(total))
			m.Add("copy_cpu_backend_us/row", benchenv.PerChange(cp.postgres, total))
			name := fmt.Sprintf("sq%d_%d", i, r)
			var queue, queue2, queueMeta phase
			if !dropOnly {
				queue = snapshotRun(b, e, pids, name, "queue")
				queue2 = snapshotRun(b, e, pids, fmt.Sprintf("sw%d_%d", i, r), "queue2")
				queueMeta = snapshotRun(b, e, pids, fmt.Sprintf("sm%d_%d", i, r), "queuemeta")
			}
			drop := snapshotRun(b, e, pids, fmt.Sprintf("sd%d_%d", i, r), "drop")
			for _, p := range []struct {
				name string
				ph   phase
			}{{"queue", queue}, {"queue2", queue2}, {"queuemeta", queueMeta}, {"drop", drop}} {
				if dropOnly && p.name != "drop" {
					continue
				}
				m.Add(p.name+"_rows/s", p.ph.rate(total))
				m.Add(p.name+"_ratio", p.ph.rate(total)/cp.rate(total))
				if p.ph.own > 0 {
					own := float64(total) / p.ph.own.Seconds()
					m.Add(p.name+"_own_rows/s", own)
					m.Add(p.name+"_own_ratio", own/cp.rate(total))
					m.Add(p.name+"_start_s", (p.ph.elapsed - p.ph.own).Seconds())
				}
				m.Add(p.name+"_cpu_pgrelay_us/row", benchenv.PerChange(p.ph.pgrelay, total))
				if p.name != "drop" {
					m.Add(p.name+"_cpu_redis_us/row", benchenv.PerChange(p.ph.redis, total))
				}
				// the chunk readers are the pipeline's ordinary backends: the whole server but the walsender
				m.Add(p.name+"_cpu_chunk_readers_us/row", benchenv.PerChange(p.ph.postgres-p.ph.walsender, total))
				m.Add(p.name+"_cpu_walsender_us/row", benchenv.PerChange(p.ph.walsender, total))
				addAlloc(&m, p.name, "row", p.ph, total)
			}
			if dropOnly {
				continue
			}
			xadd := rawXAdd(b, e, pids, name, false, false)
			multi := rawXAdd(b, e, pids, name, true, false)
			multiV2 := rawXAdd(b, e, pids, name, true, true)
			m.Add("xadd_rows/s", xadd.rate(total))
			m.Add("xadd_cpu_redis_us/row", benchenv.PerChange(xadd.redis, total))
			m.Add("queue_xadd_ratio", queue.rate(total)/xadd.rate(total))
			m.Add("multi_rows/s", multi.rate(total))
			m.Add("multi_cpu_redis_us/row", benchenv.PerChange(multi.redis, total))
			m.Add("queue_multi_ratio", queue.rate(total)/multi.rate(total))
			// The most the pipeline's three processes allow on this machine's cores if their work
			// overlapped perfectly: the cores over their CPU per row (pgrelay, Redis, PostgreSQL).
			if cpu := queue.pgrelay + queue.redis + queue.postgres; cpu > 0 {
				bound := float64(runtime.NumCPU()) * float64(total) / cpu.Seconds()
				m.Add("queue_cpu_bound_rows/s", bound)
				m.Add("queue_cpu_bound_multi_ratio", bound/multi.rate(total))
			}
			m.Add("queue2_multi_ratio", queue2.rate(total)/multi.rate(total))
			m.Add("multiv2_rows/s", multiV2.rate(total))
			m.Add("multiv2_cpu_redis_us/row", benchenv.PerChange(multiV2.redis, total))
			m.Add("queue_multiv2_ratio", queue.rate(total)/multiV2.rate(total))
			m.Add("queue2_multiv2_ratio", queue2.rate(total)/multiV2.rate(total))
			m.Add("queue2_vs_queue_ratio", queue2.rate(total)/queue.rate(total))
			m.Add("queue_vs_queuemeta_ratio", queue.rate(total)/queueMeta.rate(total))
		}
		m.Report(b)
	}
}

func cpuOf(b *testing.B, pid int) time.Duration {
	d, err := benchenv.CPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// snapshotRun runs a new pg_cdc source name (queue of the same name) with snapshot: initial of
// snap until the pointer's snapshot is null, and returns the window with the CPU of its
// walsender: kind "queue" into redis_queue with metadata: false, "queue2" the same with
// max_in_flight 2 (two batches in flight), "queuemeta" into redis_queue with pg_cdc's metadata,
// "drop" the source alone (with metadata).
func snapshotRun(b *testing.B, e *env, pids benchProcs, name, kind string) phase {
	drop := kind == "drop"
	inFlight := benchOutputExtra()
	if kind == "queue2" {
		inFlight = "\n    max_in_flight: 2" + benchLayout()
	}
	defer benchenv.Profile(b, "snapshot_"+kind)()
	extra := "snapshot: initial\n" + os.Getenv("PGRELAY_BENCH_SNAPSHOT_EXTRA")
	if kind == "queue" || kind == "queue2" {
		extra = "snapshot: initial\nmetadata: false\n" + os.Getenv("PGRELAY_BENCH_SNAPSHOT_EXTRA")
	}
	m := startMeter(b, pids)
	var stop func()
	marks := &snapshotMarks{}
	if drop { // the source alone: pointer written after each ack
		stop = runStream(b, fmt.Sprintf("input:\n  pg_cdc:\n    name: %s\n    dsn: %s\n    tls: {mode: disable}\n    tables: [{table: snap, queue: %s}]\n    redis: {url: %s}\n%s\noutput:\n  drop: {}\n",
			name, e.pg.DSN(), name, e.rd.URL(), indent(extra)), slog.New(marks))
	} else {
		stop = startStream(b, fmt.Sprintf("input:\n  pg_cdc:\n    name: %s\n    dsn: %s\n    tls: {mode: disable}\n    tables: [{table: snap, queue: %s}]\n    redis: {url: %s}\n%s\noutput:\n  redis_queue:\n    url: %s\n    durability: %s%s\nlogger:\n  level: warn\n",
			name, e.pg.DSN(), name, e.rd.URL(), indent(extra), e.rd.URL(), benchDurability(), inFlight))
	}
	defer stop()
	key := "pgrelay:{" + name + "}:src:" + name + ":ptr"
	rdb := e.rd.Client()
	ws := 0
	deadline := time.Now().Add(30 * time.Minute)
	for {
		if ws == 0 {
			ws, _ = benchenv.WalsenderPid(e.ctx, e.pg.Pool(), "pgrelay_"+name)
		}
		if p, err := source.ReadPointer(e.ctx, rdb, key); err == nil && p != nil && string(p.Snapshot) == "null" {
			ph := m.end()
			if ws != 0 {
				ph.walsender = cpuOf(b, ws)
			}
			// "snapshot done" is logged once the last chunk is acknowledged, by the snapshot's own
			// goroutine: the cover writer may store the pointer first (the marks' times are the
			// lines' own, so the wait does not change own)
			for wait := time.Now().Add(5 * time.Second); drop && marks.own() == 0 && time.Now().Before(wait); {
				time.Sleep(5 * time.Millisecond)
			}
			if ph.own = marks.own(); drop && ph.own == 0 {
				b.Fatal(`pg_cdc logged no "snapshot of … table(s) at" and "snapshot done" lines: snapshotMarks must follow their text`)
			}
			return ph
		}
		if time.Now().After(deadline) {
			b.Fatalf("snapshot %s not done", name)
		}
		// The poll (a GET and the pointer's JSON, ~0.1 ms of CPU) runs in pgrelay's process and
		// counts in its CPU: every 5 ms it was ~6 % of a snapshot's; every 20 ms, at most 1 % more
		// wall time on a 2-second window.
		time.Sleep(20 * time.Millisecond)
	}
}

// snapshotMarks is a log handler that notes when pg_cdc's snapshot started and when it was done
// (its Info lines), and passes warnings and errors on to stderr.
type snapshotMarks struct {
	mu          sync.Mutex
	start, done time.Time
}

func (h *snapshotMarks) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *snapshotMarks) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case strings.Contains(r.Message, "snapshot of") && strings.Contains(r.Message, "table(s) at") && h.start.IsZero():
		h.start = r.Time
	case strings.HasSuffix(r.Message, "snapshot done"):
		h.done = r.Time
	case r.Level >= slog.LevelWarn:
		fmt.Fprintln(os.Stderr, r.Level, r.Message)
	}
	return nil
}

func (h *snapshotMarks) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *snapshotMarks) WithGroup(string) slog.Handler      { return h }

// own is the time from the snapshot's start to its end (0 when either was not logged).
func (h *snapshotMarks) own() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.start.IsZero() || h.done.IsZero() {
		return 0
	}
	return h.done.Sub(h.start)
}
