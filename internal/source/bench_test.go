package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func BenchmarkSourceTx1(b *testing.B)    { benchSource(b, 1) }
func BenchmarkSourceTx10(b *testing.B)   { benchSource(b, 10) }
func BenchmarkSourceTx1000(b *testing.B) { benchSource(b, 1000) }

// benchSource writes PGRELAY_BENCH_CHANGES rows (200,000; 20,000 in quick mode) in transactions
// of txRows into bench(id bigint, v text, n numeric, ts timestamptz), then drains the same WAL,
// in PGRELAY_BENCH_RUNS alternating runs (each from slots made before the rows were written; the
// raw baseline first, then pg_cdc's four phases in an order rotated by one from run to run):
//
//   - raw: pg_recvlogical (C, PostgreSQL's own client) writing the pgoutput bytes to /dev/null:
//     its walsender's CPU per change is the decode cost, its rate the decode ceiling;
//   - queue: pg_cdc into redis_queue (durability aof unless PGRELAY_BENCH_FSYNC says otherwise)
//     with metadata: false, as config/pg_cdc_redis_queue.yaml ships it; queue2 the same with
//     max_in_flight 2; queuemeta with pg_cdc's metadata on every message (metadata: true, the
//     default);
//   - drop: pg_cdc into the drop output (the source alone, metadata: true);
//   - xadd: the entries pg_cdc wrote, XADDed again in plain pipelines of 1,000 (the Redis ceiling);
//   - multi: the same in MULTI/EXEC pipelines of 1,000 (one AOF write and fsync per 1,000).
//
// It reports the medians of the rates, their ratios to raw, the CPU time per change of each
// process (pgrelay is this process: the pipeline runs in-process) and the projected ratio with a
// core per process: decode CPU per change ÷ the largest per-change CPU of the pipeline's processes.
func benchSource(b *testing.B, txRows int) {
	total := benchenv.Size("PGRELAY_BENCH_CHANGES", 200000, 20000)
	runs := benchenv.Runs()
	defer benchenv.RuntimeLikeBinary()()
	e := &env{t: b, pg: testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off")),
		rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	recv, err := benchenv.PGClientBin(e.pg.BinDir, "pg_recvlogical")
	if err != nil {
		b.Fatal(err)
	}
	pids := benchPids(b, e)
	e.pg.Exec(`CREATE TABLE bench (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	e.pg.Exec(`CREATE PUBLICATION raw FOR TABLE bench`)
	for r := 0; r < runs; r++ {
		e.pg.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, "raw"+strconv.Itoa(r))
		for _, name := range []string{"q" + strconv.Itoa(r), "w" + strconv.Itoa(r), "m" + strconv.Itoa(r), "d" + strconv.Itoa(r)} {
			stop := runBench(b, e, name)
			waitBenchPointer(b, e, name, name)
			stop()
		}
	}
	var before pglogrepl.LSN
	for i := 0; i < total; i += txRows {
		if i+txRows >= total { // the last transaction commits past this LSN
			before = currentLSN(b, e)
		}
		e.pg.Exec(`INSERT INTO bench SELECT g, 'value ' || g, g * 1.5, now() FROM generate_series($1::bigint, $2::bigint) g`, i, i+txRows-1)
	}
	// Two non-transactional messages after the data: pg_recvlogical stops at the second
	// (--endpos is the first), after decoding every transaction.
	var endpos string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_logical_emit_message(false, 'bench', 'end')::text`).Scan(&endpos); err != nil {
		b.Fatal(err)
	}
	e.pg.Exec(`SELECT pg_logical_emit_message(false, 'bench', 'after')`)
	e.pg.Exec(`CHECKPOINT`)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < runs; r++ {
			raw := recvLogical(b, e, pids, recv, "raw"+strconv.Itoa(r), endpos)
			// pg_cdc's phases in an order rotated from run to run: the first phase after the raw
			// baseline met the walsender's slow pace more often (see benchmark-notes.md), and that
			// should not fall on the same phase in every run
			ph := map[string]phase{}
			slots := []string{"q", "w", "m", "d"}
			for k := range slots {
				slot := slots[(k+r)%len(slots)]
				ph[slot] = catchUp(b, e, pids, slot+strconv.Itoa(r), before)
			}
			queue, queue2, queueMeta, drop := ph["q"], ph["w"], ph["m"], ph["d"]
			xadd := rawXAdd(b, e, pids, "q"+strconv.Itoa(r), false, false)
			multi := rawXAdd(b, e, pids, "q"+strconv.Itoa(r), true, false)
			multiV2 := rawXAdd(b, e, pids, "q"+strconv.Itoa(r), true, true)
			decode := benchenv.PerChange(raw.walsender, total)
			m.Add("raw_changes/s", raw.rate(total))
			m.Add("raw_cpu_walsender_us/change", decode)
			m.Add("raw_cpu_pg_recvlogical_us/change", benchenv.PerChange(raw.client, total))
			for _, p := range []struct {
				name string
				ph   phase
			}{{"queue", queue}, {"queue2", queue2}, {"queuemeta", queueMeta}, {"drop", drop}} {
				m.Add(p.name+"_changes/s", p.ph.rate(total))
				m.Add(p.name+"_ratio", p.ph.rate(total)/raw.rate(total))
				m.Add(p.name+"_cpu_pgrelay_us/change", benchenv.PerChange(p.ph.pgrelay, total))
				if p.name != "drop" {
					m.Add(p.name+"_cpu_redis_us/change", benchenv.PerChange(p.ph.redis, total))
				}
				m.Add(p.name+"_cpu_walsender_us/change", benchenv.PerChange(p.ph.walsender, total))
				m.Add(p.name+"_cpu_postgres_other_us/change", benchenv.PerChange(p.ph.postgres-p.ph.walsender, total))
				m.Add(p.name+"_projected_ratio", decode/benchenv.PerChange(max(p.ph.pgrelay, p.ph.redis, p.ph.walsender), total))
				addAlloc(&m, p.name, "change", p.ph, total)
			}
			m.Add("queue2_vs_queue_ratio", queue2.rate(total)/queue.rate(total))
			m.Add("queue_vs_queuemeta_ratio", queue.rate(total)/queueMeta.rate(total))
			m.Add("xadd_changes/s", xadd.rate(total))
			m.Add("xadd_ratio", xadd.rate(total)/raw.rate(total))
			m.Add("xadd_cpu_redis_us/change", benchenv.PerChange(xadd.redis, total))
			m.Add("multi_changes/s", multi.rate(total))
			m.Add("multi_ratio", multi.rate(total)/raw.rate(total))
			m.Add("multi_cpu_redis_us/change", benchenv.PerChange(multi.redis, total))
			m.Add("multiv2_changes/s", multiV2.rate(total))
			m.Add("multiv2_ratio", multiV2.rate(total)/raw.rate(total))
			m.Add("multiv2_cpu_redis_us/change", benchenv.PerChange(multiV2.redis, total))
		}
		m.Report(b)
	}
}

// benchProcs are the pids whose CPU time the benchmarks read.
type benchProcs struct {
	postmaster int // the PostgreSQL server (TreeCPU: every backend)
	redis      int
	rdb        *redis.Client // the same Redis, to wait for its background AOF rewrite (startMeter)
}

func benchPids(b *testing.B, e *env) benchProcs {
	pm, err := benchenv.PostmasterPid(e.pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	rd, err := benchenv.RedisPid(e.ctx, e.rd.Client())
	if err != nil {
		b.Fatal(err)
	}
	return benchProcs{postmaster: pm, redis: rd, rdb: e.rd.Client()}
}

// phase is one measured window: its duration and the CPU time each process used in it.
type phase struct {
	elapsed   time.Duration
	own       time.Duration // the part of elapsed the component itself logged as its work (0: not known)
	pgrelay   time.Duration // this process (the in-process pipeline)
	redis     time.Duration
	walsender time.Duration // the walsender serving the pipeline's slot
	postgres  time.Duration // the whole PostgreSQL server, walsender included
	client    time.Duration // an external client (pg_recvlogical)
	// what this process allocated in the window (the in-process pipeline's garbage)
	allocBytes, allocs uint64
	gcs                uint32
}

func (p phase) rate(n int) float64 { return float64(n) / p.elapsed.Seconds() }

// meter reads the CPU counters at the start of a window; end returns the phase.
type meter struct {
	b                 *testing.B
	pids              benchProcs
	start             time.Time
	self, rd, pgTotal time.Duration
	mem               runtime.MemStats
}

// startMeter starts a window once Redis has no AOF rewrite running: a rewrite an earlier window's
// writes set off (Redis' auto-aof-rewrite) runs in a forked child whose CPU would be taken from
// the next window's processes, whatever they are.
func startMeter(b *testing.B, pids benchProcs) *meter {
	if pids.rdb != nil {
		waitNoRewrite(b, pids.rdb)
	}
	m := &meter{b: b, pids: pids}
	runtime.ReadMemStats(&m.mem)
	m.self, m.rd, m.pgTotal = benchenv.SelfCPU(), m.cpu(benchenv.CPU, pids.redis), m.cpu(benchenv.TreeCPU, pids.postmaster)
	m.start = time.Now()
	return m
}

// waitNoRewrite waits until Redis has no AOF rewrite running or scheduled.
func waitNoRewrite(b *testing.B, rdb *redis.Client) {
	start := time.Now()
	if _, err := testenv.WaitRewrite(context.Background(), rdb, 5*time.Minute); err != nil {
		b.Fatal(err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		b.Logf("waited %v for Redis' AOF rewrite before a window", d.Round(time.Millisecond))
	}
}

func (m *meter) cpu(read func(int) (time.Duration, error), pid int) time.Duration {
	d, err := read(pid)
	if err != nil {
		m.b.Fatal(err)
	}
	return d
}

func (m *meter) end() phase {
	p := phase{elapsed: time.Since(m.start), pgrelay: benchenv.SelfCPU() - m.self,
		redis: m.cpu(benchenv.CPU, m.pids.redis) - m.rd, postgres: m.cpu(benchenv.TreeCPU, m.pids.postmaster) - m.pgTotal}
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	p.allocBytes, p.allocs, p.gcs = mem.TotalAlloc-m.mem.TotalAlloc, mem.Mallocs-m.mem.Mallocs, mem.NumGC-m.mem.NumGC
	return p
}

// addAlloc reports what the in-process pipeline allocated per change (or row) in window p.
func addAlloc(m *benchenv.Metrics, name, per string, p phase, n int) {
	m.Add(name+"_alloc_bytes/"+per, float64(p.allocBytes)/float64(n))
	m.Add(name+"_allocs/"+per, float64(p.allocs)/float64(n))
	m.Add(name+"_gc_cycles", float64(p.gcs))
}

// currentLSN is the server's pg_current_wal_lsn().
func currentLSN(tb testing.TB, e *env) pglogrepl.LSN {
	var s string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		tb.Fatal(err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// recvLogical runs pg_recvlogical on slot until endpos, its pgoutput bytes to /dev/null, and
// returns the window with its walsender's CPU and its own.
func recvLogical(b *testing.B, e *env, pids benchProcs, bin, slot, endpos string) phase {
	cmd := exec.Command(bin, "-d", benchenv.PGDSN(e.pg), "-S", slot, "--start", "-E", endpos, "--no-loop", "-f", "/dev/null",
		"-o", "proto_version=1", "-o", "publication_names=raw", "-o", "messages=true")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	m := startMeter(b, pids)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ws, err := benchenv.SlotPid(e.ctx, e.pg.Pool(), slot, 30*time.Second)
	if err != nil {
		cmd.Process.Kill()
		b.Fatalf("%v: %s", err, out.String())
	}
	sampler := benchenv.Sample(ws)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("pg_recvlogical: %v: %s", err, out.String())
	}
	p := m.end()
	p.walsender = sampler.Stop()
	p.client = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	p.pgrelay = 0
	return p
}

// rawXAdd reads back every entry pg_cdc wrote to queue q and times writing them again, same
// fields and bytes, to other keys with pipelines of about 1,000 messages in plain XADDs: what the
// Redis server itself costs under this run's settings. With multi each pipeline is one MULTI/EXEC:
// with appendfsync always a plain pipeline costs Redis an AOF write and fsync per read of the socket
// (~16 KiB), a transaction one per pipeline, like pgrelay's one write per batch. With unpack each
// message of a layout-3 entry is written as an entry of its own in layout 2 (m and d): the ceiling
// of the same changes one entry each. The keys are deleted afterwards.
func rawXAdd(b *testing.B, e *env, pids benchProcs, q string, multi, unpack bool) phase {
	rdb := e.rd.Client()
	type entry struct {
		key  string
		vals []any
		n    int // messages
	}
	var entries []entry
	for n := 0; n < 16; n++ {
		key := "pgrelay:{" + q + "}:s:" + strconv.Itoa(n)
		xs, err := rdb.XRange(e.ctx, key, "-", "+").Result()
		if err != nil {
			b.Fatal(err)
		}
		to := "xadd:{x" + q + "}:s:" + strconv.Itoa(n)
		for _, x := range xs {
			es := queue.EntriesOf(nil, x)
			switch _, hasMeta := x.Values[queue.FieldMeta]; {
			case unpack:
				for i := range es {
					entries = append(entries, entry{to, []any{queue.FieldMeta, queue.AppendEntryMeta(nil, &es[i]), queue.FieldPayload, es[i].Payload}, 1})
				}
			case hasMeta: // layouts 2 and 3: m and d
				entries = append(entries, entry{to, []any{queue.FieldMeta, x.Values[queue.FieldMeta], queue.FieldPayload, x.Values[queue.FieldPayload]}, len(es)})
			default: // layout 1: the seven fields in their order (DESIGN §4)
				var vals []any
				for _, f := range []string{queue.FieldOffset, queue.FieldPartition, queue.FieldID, queue.FieldTx, queue.FieldCreated, queue.FieldHeader, queue.FieldPayload} {
					vals = append(vals, f, x.Values[f])
				}
				entries = append(entries, entry{to, vals, 1})
			}
		}
	}
	m := startMeter(b, pids)
	pipelined := rdb.Pipelined
	if multi {
		pipelined = rdb.TxPipelined
	}
	for i := 0; i < len(entries); {
		_, err := pipelined(e.ctx, func(p redis.Pipeliner) error {
			for msgs := 0; i < len(entries) && msgs < 1000; i++ {
				p.XAdd(e.ctx, &redis.XAddArgs{Stream: entries[i].key, Values: entries[i].vals})
				msgs += entries[i].n
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	p := m.end()
	p.pgrelay = 0
	for n := 0; n < 16; n++ {
		rdb.Del(e.ctx, "xadd:{x"+q+"}:s:"+strconv.Itoa(n))
	}
	return p
}

// catchUp runs pg_cdc name from its pointer until it has delivered the transaction committed
// after LSN before, and returns the window. The pipeline runs in this process: its CPU is
// this process' over the window (the pointer polling beside it costs ~1 %).
func catchUp(b *testing.B, e *env, pids benchProcs, name string, before pglogrepl.LSN) phase {
	kind := map[byte]string{'q': "queue", 'w': "queue2", 'm': "queuemeta", 'd': "drop"}[name[0]]
	defer benchenv.Profile(b, "stream_"+kind)()
	m := startMeter(b, pids)
	stop := runBench(b, e, name)
	defer stop()
	rdb := e.rd.Client()
	ws := 0
	for {
		if ws == 0 {
			ws, _ = benchenv.WalsenderPid(e.ctx, e.pg.Pool(), "pgrelay_"+name)
		}
		raw, err := rdb.Get(e.ctx, "pgrelay:{"+name+"}:src:"+name+":ptr").Bytes()
		if err == nil {
			if p, err := pointer.Parse(raw); err == nil && p.InTxn == nil && p.LSNValue() > before {
				ph := m.end()
				if ws == 0 {
					b.Fatalf("no walsender seen for slot pgrelay_%s", name)
				}
				ph.walsender = m.cpu(benchenv.CPU, ws)
				return ph
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runBench runs pg_cdc into redis_queue with metadata: false (names q*; w*: with max_in_flight 2,
// two batches in flight; m*: with pg_cdc's metadata, the default) or into drop (names d*: the
// source alone, with the pointer written by pg_cdc after each ack); queue, pointer and slot are
// named after it.
func runBench(b *testing.B, e *env, name string) func() {
	output := fmt.Sprintf("redis_queue:\n    url: %s\n    durability: %s%s", e.rd.URL(), benchDurability(), benchOutputExtra())
	meta := "false"
	switch name[0] {
	case 'w':
		output = fmt.Sprintf("redis_queue:\n    url: %s\n    durability: %s\n    max_in_flight: 2%s", e.rd.URL(), benchDurability(), benchLayout())
	case 'm':
		meta = "true"
	case 'd':
		output, meta = "drop: {}", "true"
	}
	yaml := fmt.Sprintf(`
input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: [{table: bench, queue: %s}]
    redis: {url: %s}
    metadata: %s
output:
  %s
logger:
  level: warn
`, name, benchenv.PGDSN(e.pg), name, e.rd.URL(), meta, output)
	return startStream(b, yaml)
}

func waitBenchPointer(b *testing.B, e *env, queue, name string) {
	for e.rd.Client().Exists(e.ctx, "pgrelay:{"+queue+"}:src:"+name+":ptr").Val() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkSourceLatency writes single-row transactions at a steady PGRELAY_BENCH_TPS (default
// 2,000/s) for PGRELAY_BENCH_SECONDS (5; 2 in quick mode) per run and reports commit→queue latency percentiles: from the event's commit time
// (`ts`, PostgreSQL's clock) to the moment a blocking XREAD returned it (same host clock). The
// baseline, measured at the same time on the same transactions: commit time → the commit message
// decoded by pglogrepl from a plain pgoutput slot (raw_p50_ms, raw_p99_ms), what PostgreSQL and
// the host cost before any connector does anything. Medians of PGRELAY_BENCH_RUNS runs; also
// p99_over_raw_ms, the p99 minus the raw p99 of the same run, and redis_fsync_max_ms, the slowest
// AOF fsync Redis recorded in the run (every queue write waits for one with appendfsync always, so a
// stalling disk lengthens pgrelay's tail and not the raw one).
func BenchmarkSourceLatency(b *testing.B) {
	defer benchenv.RuntimeLikeBinary()()
	tps := 2000
	if n, err := strconv.Atoi(os.Getenv("PGRELAY_BENCH_TPS")); err == nil && n > 0 {
		tps = n
	}
	e := &env{t: b, pg: testenv.StartPostgres(b), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE lat (id bigint PRIMARY KEY, v text)`)
	e.pg.Exec(`CREATE PUBLICATION rawlat FOR TABLE lat`)
	e.pg.Exec(`SELECT pg_create_logical_replication_slot('rawlat', 'pgoutput')`)
	startStream(b, fmt.Sprintf(`
input:
  pg_cdc:
    name: lat
    dsn: %s
    tls: {mode: disable}
    tables: [{table: lat, queue: q, partition_by: single}]
    redis: {url: %s}
output:
  redis_queue:
    url: %s
    durability: %s
logger:
  level: warn
`, e.pg.DSN(), e.rd.URL(), e.rd.URL(), durability()))
	waitBenchPointer(b, e, "q", "lat")
	e.pg.Exec(`INSERT INTO lat VALUES (0, 'warm-up')`)
	stream := "pgrelay:{q}:s:" + strconv.Itoa(int(crc32.ChecksumIEEE([]byte("all"))%16))
	for e.rd.Client().XLen(e.ctx, stream).Val() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	seconds := benchenv.Size("PGRELAY_BENCH_SECONDS", 5, 2)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m latencyMetrics
		for r := 0; r < benchenv.Runs(); r++ {
			m.latencyRun(b, e, stream, tps, tps*seconds, int64(i*100+r+1)*10_000_000)
		}
		m.Report(b)
	}
}

// latencyMetrics collects BenchmarkSourceLatency's runs.
type latencyMetrics struct{ benchenv.Metrics }

// latencyRun is one run of BenchmarkSourceLatency: total transactions at tps, ids from base.
func (m *latencyMetrics) latencyRun(b *testing.B, e *env, stream string, tps, total int, base int64) {
	lat := make([]time.Duration, 0, total)
	// read from the last entry before the writers start ("$" would miss entries written
	// before the first XREAD is issued, and then wait for them forever)
	last := "0"
	if tail, err := e.rd.Client().XRevRangeN(e.ctx, stream, "+", "-", 1).Result(); err == nil && len(tail) == 1 {
		last = tail[0].ID
	}
	done := make(chan struct{})
	rawDone := make(chan []time.Duration, 1)
	rawReady := make(chan struct{})
	go func() { rawDone <- rawCommitLatency(b, e, "rawlat", total, rawReady) }()
	<-rawReady              // streaming from the WAL's end before the first transaction of the run
	reader := e.rd.Client() // one connection: Client() dials a new one per call
	go func() {
		defer close(done)
		for len(lat) < total {
			res, err := reader.XRead(e.ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: 10 * time.Second, Count: 1000}).Result()
			if err != nil {
				b.Error(err)
				return
			}
			now := time.Now()
			for _, m := range res[0].Messages {
				last = m.ID
				for _, e := range queue.EntriesOf(nil, m) {
					var ev struct{ TS string }
					json.Unmarshal(e.Payload, &ev)
					ts, _ := time.Parse("2006-01-02T15:04:05.000000Z", ev.TS)
					lat = append(lat, now.Sub(ts))
				}
			}
		}
	}()
	if err := benchenv.WatchRedisFsync(e.ctx, reader); err != nil {
		b.Fatal(err)
	}
	writeAtRate(b, e, tps, total, base)
	<-done
	sort.Slice(lat, func(a, c int) bool { return lat[a] < lat[c] })
	if len(lat) == 0 {
		b.Fatal("no events")
	}
	p99 := ms(lat[len(lat)*99/100])
	m.Add("p50_ms", ms(lat[len(lat)/2]))
	m.Add("p99_ms", p99)
	fsync, err := benchenv.RedisFsyncMax(e.ctx, reader)
	if err != nil {
		b.Fatal(err)
	}
	m.Add("redis_fsync_max_ms", fsync)
	if raw := <-rawDone; len(raw) > 0 {
		sort.Slice(raw, func(a, c int) bool { return raw[a] < raw[c] })
		m.Add("raw_p50_ms", ms(raw[len(raw)/2]))
		m.Add("raw_p99_ms", ms(raw[len(raw)*99/100]))
		m.Add("p99_over_raw_ms", p99-ms(raw[len(raw)*99/100]))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// redisArgs are extra redis-server arguments for the throughput benchmarks: no automatic AOF
// rewrite (a rewrite set off by a window's own writes forks a child that takes CPU from the rest of
// that window, from pgrelay and its baseline alike, at random), PGRELAY_BENCH_FSYNC (default
// always, as every test Redis: appendonly yes, appendfsync always; e.g. "everysec"), then
// PGRELAY_BENCH_REDIS_ARGS (space-separated, e.g. "--stream-node-max-bytes 16384").
func redisArgs() []string {
	args := []string{"--auto-aof-rewrite-percentage", "0"}
	if f := os.Getenv("PGRELAY_BENCH_FSYNC"); f != "" {
		args = append(args, "--appendfsync", f)
	}
	return append(args, strings.Fields(os.Getenv("PGRELAY_BENCH_REDIS_ARGS"))...)
}

// benchOutputExtra is the redis_queue output's max_in_flight and layout_version lines of the
// benchmarks' pipelines (PGRELAY_BENCH_MAX_IN_FLIGHT, PGRELAY_BENCH_LAYOUT; unset: the output's
// defaults).
func benchOutputExtra() string {
	if n := os.Getenv("PGRELAY_BENCH_MAX_IN_FLIGHT"); n != "" {
		return "\n    max_in_flight: " + n + benchLayout()
	}
	return benchLayout()
}

// benchLayout is the output's layout_version line (PGRELAY_BENCH_LAYOUT), "" when unset.
func benchLayout() string {
	if v := os.Getenv("PGRELAY_BENCH_LAYOUT"); v != "" {
		return "\n    layout_version: " + v
	}
	return ""
}

// benchDurability is the throughput benchmarks' redis_queue durability: aof (what exactly-once
// needs) when Redis fsyncs every write, else none (aof would refuse such a server).
func benchDurability() string {
	if f := os.Getenv("PGRELAY_BENCH_FSYNC"); f != "" && f != "always" {
		return "none"
	}
	return "aof"
}

// durability is the redis_queue durability of the latency benchmark (PGRELAY_BENCH_DURABILITY,
// default aof: every acknowledged write fsynced by Redis).
func durability() string {
	if d := os.Getenv("PGRELAY_BENCH_DURABILITY"); d != "" {
		return d
	}
	return "aof"
}

// rawCommitLatency streams slot from the WAL's current end (transactions of earlier runs are not
// sent again) and returns, for the next n transactions that wrote rows, the time from each
// commit's timestamp to its commit message being decoded here. ready is closed once streaming
// started (or failed). It confirms what it read, so the next run's walsender starts near the end.
func rawCommitLatency(b *testing.B, e *env, slot string, n int, ready chan<- struct{}) []time.Duration {
	readyOnce := sync.OnceFunc(func() { close(ready) })
	defer readyOnce()
	cfg, _ := pgconn.ParseConfig(e.pg.DSN() + "&replication=database")
	conn, err := pgconn.ConnectConfig(e.ctx, cfg)
	if err != nil {
		b.Error(err)
		return nil
	}
	defer conn.Close(e.ctx)
	// the walsender of the previous run's reader may not have exited yet
	for deadline := time.Now().Add(30 * time.Second); ; {
		var active bool
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active); err != nil {
			b.Error(err)
			return nil
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			b.Errorf("slot %s still in use after 30 s", slot)
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	var end string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		b.Error(err)
		return nil
	}
	start, err := pglogrepl.ParseLSN(end)
	if err != nil {
		b.Error(err)
		return nil
	}
	if err := pglogrepl.StartReplication(e.ctx, conn, slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"}}); err != nil {
		b.Error(err)
		return nil
	}
	readyOnce()
	out := make([]time.Duration, 0, n)
	rows := false
	flushed := start
	confirm := func() {
		_ = pglogrepl.SendStandbyStatusUpdate(e.ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: flushed, WALFlushPosition: flushed})
	}
	defer confirm()
	for len(out) < n {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		msg, err := conn.ReceiveMessage(ctx)
		cancel()
		if err != nil {
			b.Error(err)
			return out
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			if ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:]); err == nil && ka.ReplyRequested {
				confirm()
			}
			continue
		case pglogrepl.XLogDataByteID:
		default:
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			b.Error(err)
			return out
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			b.Error(err)
			return out
		}
		switch m := m.(type) {
		case *pglogrepl.InsertMessage:
			rows = true
		case *pglogrepl.CommitMessage:
			now := time.Now()
			if rows {
				out = append(out, now.Sub(m.CommitTime))
			}
			rows, flushed = false, m.CommitLSN
		}
	}
	return out
}

// writeAtRate inserts total single-row transactions at tps from 4 connections, ids from base.
func writeAtRate(b *testing.B, e *env, tps, total int, base int64) {
	const writers = 4
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			interval := time.Second * writers / time.Duration(tps)
			next := time.Now()
			for n := w; n < total; n += writers {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				if _, err := e.pg.Pool().Exec(e.ctx, `INSERT INTO lat VALUES ($1, 'x')`, base+int64(n)); err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
}
