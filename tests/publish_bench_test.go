package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/benchenv/follow"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// publishDDL is the benchmark's business table, the outbox of the baseline, and the table pg_cdc
// is configured with (never written: pgrelay.publish() needs no table in the publication).
const publishDDL = `
CREATE TABLE bench_orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL);
CREATE TABLE outbox (id bigserial PRIMARY KEY, partition text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE unused (id int PRIMARY KEY);`

// The two ways to commit an order together with its event, one statement (one round trip) each.
const (
	publishTx = `WITH o AS (INSERT INTO bench_orders VALUES ($1, $2, $3) RETURNING id)
		SELECT pgrelay.publish('pub', id::text, $4::jsonb) FROM o`
	outboxTx = `WITH o AS (INSERT INTO bench_orders VALUES ($1, $2, $3) RETURNING id)
		INSERT INTO outbox (partition, payload) SELECT id::text, $4::jsonb FROM o`
)

// BenchmarkPublishOutbox compares pgrelay.publish() → pg_cdc → queue with a transactional outbox
// measured in the same run: the same transaction (insert an order, and its ~200-byte event in the
// same commit) either publishes the event (a logical message: pg_cdc, the binary, writes it to
// queue "pub" with durability aof) or inserts it into an outbox table, from which a poller moves
// rows to queue "obx" with the same queue writer (atomic script, same layout, aof) and deletes
// them: one transaction per poll of up to 1,000 rows (DELETE … RETURNING, FOR UPDATE SKIP LOCKED,
// oldest first), sleeping PGRELAY_BENCH_OUTBOX_POLL (1ms) when the outbox is empty.
//
// Alternating runs (PGRELAY_BENCH_RUNS, 3) of each side:
//   - latency: PGRELAY_BENCH_PUBLISH_TPS (1,000) transactions/s for PGRELAY_BENCH_SECONDS (5):
//     the commit time (PostgreSQL's commit timestamp: the event's ts, pg_xact_commit_timestamp of
//     the outbox row) → a blocking XREAD returns the entry, p50 and p99;
//   - throughput: 4 writers as fast as they go for the same time: events / (start → the last one
//     in the queue);
//
// with the CPU time per event of PostgreSQL (and of its walsender alone, included in it),
// redis-server, pg_cdc and the benchmark process (the
// writers, and on the outbox side the poller: the difference is the poller's), and the dead outbox
// rows left for VACUUM (pgrelay.publish() leaves none). pg_cdc runs during the publish side's runs
// only, so no walsender decodes the outbox side's WAL.
//
// PGRELAY_BENCH_WALSENDER_NICE (e.g. 10) lowers the walsender's priority in the throughput runs,
// so it falls behind the writers as it does when other work shares the cores (default: unchanged).
// PGRELAY_BENCH_PG_SOCKET=1 connects everything (writers, poller, pg_cdc) over PostgreSQL's Unix
// socket instead of TCP on 127.0.0.1: on loopback TCP the sender's system call also runs the
// receiver's TCP processing, which makes each of the walsender's sends (three per one-event
// transaction: begin, message, commit, each flushed on its own) cost it several times more.
func BenchmarkPublishOutbox(b *testing.B) {
	pg := testenv.StartPostgres(b, testenv.WithPGSetting("track_commit_timestamp = on"))
	rd := testenv.StartRedis(b)
	pg.Exec(publishDDL)
	ctx := context.Background()
	dsn := benchenv.PGDSN(pg)
	httpConf := "{ enabled: false }"
	profileDir := os.Getenv("PGRELAY_BENCH_PROFILE")
	port := 0
	if profileDir != "" { // CPU profiles of pg_cdc through Benthos' debug endpoints
		port = testenv.FreePort(b)
		httpConf = fmt.Sprintf("{ address: 127.0.0.1:%d, debug_endpoints: true }", port)
	}
	config := filepath.Join(b.TempDir(), "pub.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
http: %s
logger: { level: warn }
input:
  pg_cdc:
    name: pub
    dsn: %q
    tables: [ { table: public.unused, queue: pub } ]
    redis: { url: %s }
    metadata: false
output:
  redis_queue:
    url: %s
    durability: aof
`, httpConf, dsn, rd.URL(), rd.URL())), 0o600); err != nil {
		b.Fatal(err)
	}
	pm, err := benchenv.PostmasterPid(pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	rpid, err := benchenv.RedisPid(ctx, rd.Client())
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &pubEnv{b: b, pool: pool, rd: rd, pm: pm, rpid: rpid, config: config, profileDir: profileDir, debugPort: port}
	e.poll = time.Duration(benchenv.Size("PGRELAY_BENCH_OUTBOX_POLL_MS", 1, 1)) * time.Millisecond
	if v := os.Getenv("PGRELAY_BENCH_WALSENDER_NICE"); v != "" {
		if e.walsenderNice, err = strconv.Atoi(v); err != nil {
			b.Fatalf("PGRELAY_BENCH_WALSENDER_NICE: %v", err)
		}
	}
	seconds := time.Duration(benchenv.Size("PGRELAY_BENCH_SECONDS", 5, 2)) * time.Second
	tps := benchenv.Size("PGRELAY_BENCH_PUBLISH_TPS", 1000, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < benchenv.Runs(); r++ {
			e.latency(&m, "pub", tps, seconds)
			e.latency(&m, "outbox", tps, seconds)
			pub := e.throughput(&m, "pub", seconds)
			obx := e.throughput(&m, "outbox", seconds)
			m.Add("ratio", pub/obx)
		}
		var dead int64
		if err := pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(&dead); err != nil {
			b.Fatal(err)
		}
		m.Add("outbox_dead_rows", float64(dead))
		m.Report(b)
	}
}

// pubEnv is BenchmarkPublishOutbox's servers, pids and the id counter of the orders.
type pubEnv struct {
	b    *testing.B
	pool *pgxpool.Pool
	rd   *testenv.Redis
	pm   int // postmaster
	rpid int // redis-server
	poll time.Duration
	id   atomic.Int64
	// walsenderNice (PGRELAY_BENCH_WALSENDER_NICE, 0: unchanged) is the nice value the throughput
	// runs give pg_cdc's walsender: one starved of CPU on shared cores, as under other load.
	walsenderNice int

	config     string           // pg_cdc's
	source     *testenv.Process // pg_cdc, running during the publish side's runs only
	profileDir string           // PGRELAY_BENCH_PROFILE
	debugPort  int              // pg_cdc's http server with debug endpoints, when profiling
	pollerStep atomic.Value     // string: what the outbox poller is doing, logged when the queue stalls
}

// logStall logs what the outbox poller was doing and PostgreSQL's sessions, when the events of a
// run did not all reach the queue in time.
func (e *pubEnv) logStall() {
	e.b.Logf("queue stalled; outbox poller step: %v", e.pollerStep.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, `SELECT pid, backend_type, coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''),
		coalesce(now() - xact_start, '0'::interval)::text, left(coalesce(query, ''), 120) FROM pg_stat_activity`)
	if err != nil {
		e.b.Logf("pg_stat_activity: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var typ, state, wtype, wevent, age, query string
		if err := rows.Scan(&pid, &typ, &state, &wtype, &wevent, &age, &query); err != nil {
			e.b.Logf("pg_stat_activity: %v", err)
			return
		}
		e.b.Logf("pg_stat_activity: pid %d %s state=%s wait=%s/%s xact_age=%s query=%q", pid, typ, state, wtype, wevent, age, query)
	}
}

// startSource starts pg_cdc and waits until it has caught up: an event published now is in the
// queue (the first one also creates the queue).
func (e *pubEnv) startSource() {
	e.source = testenv.StartProcess(e.b, nil, testenv.Binary(e.b), "-c", e.config)
	ctx := context.Background()
	cdctest.WaitEvery(e.b, time.Minute, 10*time.Millisecond, "pg_cdc to install pgrelay.publish()", func() (bool, string) {
		var ok bool
		err := e.pool.QueryRow(ctx, `SELECT to_regprocedure('pgrelay.publish(text,text,jsonb)') IS NOT NULL`).Scan(&ok)
		return err == nil && ok, fmt.Sprint(err)
	})
	cdctest.WaitEvery(e.b, time.Minute, 10*time.Millisecond, "pg_cdc's pointer (its slot exists)", func() (bool, string) {
		n, err := e.rd.Client().Exists(ctx, "pgrelay:{pub}:src:pub:ptr").Result()
		return err == nil && n == 1, fmt.Sprint(err)
	})
	want := queueLen(e.b, e.rd, "pub") + 1
	e.commit(ctx, publishTx)
	cdctest.WaitEvery(e.b, time.Minute, 10*time.Millisecond, "pg_cdc to catch up", func() (bool, string) { return queueLen(e.b, e.rd, "pub") >= want, "" })
}

// stopSource ends pg_cdc (SIGTERM: it releases its lease at once), so the outbox side runs
// without a walsender decoding its WAL, as an outbox deployment would.
func (e *pubEnv) stopSource() {
	e.source.Signal(syscall.SIGTERM)
	if err := e.source.Wait(30 * time.Second); err != nil {
		e.b.Logf("pg_cdc: %v", err)
	}
	e.source.Kill()
}

// commit runs one order transaction with sql (publishTx or outboxTx).
func (e *pubEnv) commit(ctx context.Context, sql string) {
	id := e.id.Add(1)
	payload := fmt.Sprintf(`{"order_id": %d, "customer": "customer-%d", "total": "%d.%02d", "lines": [{"sku": "SKU-%d", "qty": 2}, {"sku": "SKU-%d", "qty": 1}], "placed_by": "web"}`,
		id, id%997, id%1000, id%100, id%31, id%17)
	if _, err := e.pool.Exec(ctx, sql, id, "customer-"+strconv.FormatInt(id%997, 10), fmt.Sprintf("%d.%02d", id%1000, id%100), payload); err != nil {
		e.b.Error(err) // from the writers' goroutines: no Fatal
	}
}

// queueLen is the number of entries ever written to queue q.
func queueLen(b *testing.B, rd *testenv.Redis, q string) int64 {
	rdb := rd.Client()
	defer rdb.Close()
	info, err := queue.Inspect(context.Background(), rdb, queue.NewLayout("pgrelay"), q)
	if errcode.Is(err, errcode.NoQueue) {
		return 0
	}
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, sh := range info.ShardInfo {
		n += sh.LastOffset
	}
	return n
}

// side is "pub" (pgrelay.publish()) or "outbox"; it returns the transaction's SQL, its queue and
// starts the outbox's poller (stopped by the returned func, which waits for it).
func (e *pubEnv) side(side string) (sql, q string, stop func()) {
	if side == "pub" {
		e.startSource()
		return publishTx, "pub", e.stopSource
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.outboxPoller(ctx) }()
	return outboxTx, "obx", func() { cancel(); <-done }
}

// outboxPoller moves outbox rows to queue "obx" and deletes them, oldest first, one transaction
// per poll, until ctx ends.
func (e *pubEnv) outboxPoller(ctx context.Context) {
	rdb := e.rd.Client()
	defer rdb.Close()
	w := queue.NewWriter(rdb, queue.WriterConfig{Shards: 16, Durability: queue.Durability{AOF: true}})
	msgs := make([]queue.Message, 0, 1000)
	var polls, moved int
	var busy time.Duration
	defer func() {
		var dead, live, pages int64
		_ = e.pool.QueryRow(context.Background(), `SELECT n_dead_tup, n_live_tup, pg_relation_size('outbox') / 8192 FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(&dead, &live, &pages)
		e.b.Logf("outbox poller: %d polls, %d rows moved, %.2f ms per poll; outbox now %d live and %d dead rows in %d pages",
			polls, moved, float64(busy.Microseconds())/1000/float64(max(polls, 1)), live, dead, pages)
	}()
	for ctx.Err() == nil {
		t0 := time.Now()
		e.pollerStep.Store("begin")
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.b.Errorf("outbox poller: begin: %v", err)
			}
			return
		}
		e.pollerStep.Store("delete")
		// The ids are taken first (an init plan), then deleted through the primary key, a plan no
		// statistics can change: with `id IN (subquery)` and statistics taken while the outbox was
		// nearly empty, one poll with 55,000 rows queued ran for minutes at a full core (the shape
		// of a scan of the table per id).
		rows, err := tx.Query(ctx, `DELETE FROM outbox WHERE id = ANY (ARRAY(SELECT id FROM outbox ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))
			RETURNING id, partition, payload::text, to_char(pg_xact_commit_timestamp(xmin) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`)
		if err != nil {
			tx.Rollback(context.Background())
			if ctx.Err() == nil {
				e.b.Error(err)
			}
			return
		}
		msgs = msgs[:0]
		for rows.Next() {
			var id int64
			var part, payload, ts string
			if err := rows.Scan(&id, &part, &payload, &ts); err != nil {
				rows.Close()
				tx.Rollback(context.Background())
				e.b.Errorf("outbox poller: %v", err)
				return
			}
			// the entry carries the event and its commit time, as pgrelay's `m` event does
			msgs = append(msgs, queue.Message{Queue: "obx", Partition: part, ID: "ob:" + strconv.FormatInt(id, 10),
				CreatedMs: time.Now().UnixMilli(), Payload: []byte(`{"op":"m","after":` + payload + `,"ts":"` + ts + `"}`)})
		}
		if err := rows.Err(); err != nil {
			tx.Rollback(context.Background())
			if ctx.Err() == nil {
				e.b.Error(err)
			}
			return
		}
		e.pollerStep.Store("queue write")
		if len(msgs) > 0 {
			if _, err := w.Write(ctx, msgs, nil); err != nil {
				tx.Rollback(context.Background())
				if ctx.Err() == nil {
					e.b.Error(err)
				}
				return
			}
		}
		e.pollerStep.Store("commit")
		if err := tx.Commit(ctx); err != nil {
			if ctx.Err() == nil {
				e.b.Errorf("outbox poller: commit: %v", err)
			}
			return
		}
		polls, moved, busy = polls+1, moved+len(msgs), busy+time.Since(t0)
		e.pollerStep.Store("sleep")
		if len(msgs) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(e.poll):
			}
		}
	}
}

// latency runs tps transactions/s for d on one side and adds its commit → queue p50 and p99.
func (e *pubEnv) latency(m *benchenv.Metrics, side string, tps int, d time.Duration) {
	b := e.b
	sql, q, stop := e.side(side)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	total := int(d.Seconds() * float64(tps))
	before := queueLen(b, e.rd, q)
	var lat follow.Latencies
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		rdb := e.rd.Client()
		defer rdb.Close()
		follow.Queue(ctx, rdb, q, lat.Seen)
	}()
	time.Sleep(50 * time.Millisecond) // the reader has issued its first XREAD
	var next atomic.Int64
	var wg sync.WaitGroup
	commits := make([]time.Duration, total) // each statement's own time: the machine's load, on both sides alike
	start := time.Now()
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1) - 1; k < int64(total); k = next.Add(1) - 1 {
				time.Sleep(time.Until(start.Add(time.Duration(k) * time.Second / time.Duration(tps))))
				t0 := time.Now()
				e.commit(ctx, sql)
				commits[k] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	want := before + int64(total)
	cdctest.WaitEvery(b, time.Minute, 5*time.Millisecond, side+" events in the queue", func() (bool, string) {
		n := queueLen(b, e.rd, q)
		return n >= want, fmt.Sprintf("%d of %d", n, want)
	})
	cdctest.WaitEvery(b, 10*time.Second, 5*time.Millisecond, side+" events read", func() (bool, string) {
		return lat.Len() >= total, fmt.Sprintf("%d of %d", lat.Len(), total)
	})
	cancel()
	<-reading
	m.Add(side+"_p50_ms", ms(lat.Percentile(0.50)))
	m.Add(side+"_p99_ms", ms(lat.Percentile(0.99)))
	m.Add(side+"_commit_p50_ms", ms(percentile(commits, 0.50)))
}

// throughput runs 4 writers flat out for d on one side and adds events/s (start → the last event
// in the queue) and the CPU per event of each process; it returns the rate.
func (e *pubEnv) throughput(m *benchenv.Metrics, side string, d time.Duration) float64 {
	b := e.b
	sql, q, stop := e.side(side)
	defer stop()
	ctx := context.Background()
	before := queueLen(b, e.rd, q)
	cpu := func(read func(int) (time.Duration, error), pid int) time.Duration {
		v, err := read(pid)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	var srcPid, walsender int
	if side == "pub" {
		srcPid = e.source.Pid()
		if err := e.pool.QueryRow(ctx, `SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE active_pid IS NOT NULL`).Scan(&walsender); err != nil {
			b.Fatal(err)
		}
		if e.walsenderNice != 0 {
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, walsender, e.walsenderNice); err != nil {
				b.Fatalf("nice the walsender: %v", err)
			}
		}
		if e.profileDir != "" {
			go e.profileSource(d)
		}
	}
	x0 := e.redisExecs()
	pg0, r0, c0, t0 := cpu(benchenv.TreeCPU, e.pm), cpu(benchenv.CPU, e.rpid), benchenv.SelfCPU(), time.Now()
	var s0, w0 time.Duration
	var sio0, wio0 syscalls
	if srcPid != 0 {
		s0, w0 = cpu(benchenv.CPU, srcPid), cpu(benchenv.CPU, walsender)
		sio0, wio0 = readSyscalls(srcPid), readSyscalls(walsender)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	end := t0.Add(d)
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				e.commit(ctx, sql)
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	want := before + n.Load()
	if ok, last := cdctest.Poll(10*time.Minute, 5*time.Millisecond, func() (bool, string) {
		got := queueLen(b, e.rd, q)
		return got >= want, fmt.Sprintf("%d of %d", got, want)
	}); !ok {
		e.logStall()
		b.Fatalf("timed out after 10m0s waiting for %s events in the queue (last state: %s)", side, last)
	}
	elapsed := time.Since(t0)
	events := int(n.Load())
	rate := float64(events) / elapsed.Seconds()
	m.Add(side+"_events/s", rate)
	m.Add(side+"_cpu_postgres_us/entry", benchenv.PerChange(cpu(benchenv.TreeCPU, e.pm)-pg0, events))
	m.Add(side+"_cpu_redis_us/entry", benchenv.PerChange(cpu(benchenv.CPU, e.rpid)-r0, events))
	m.Add(side+"_cpu_client_us/entry", benchenv.PerChange(benchenv.SelfCPU()-c0, events))
	m.Add(side+"_events/write", float64(events)/float64(max(e.redisExecs()-x0, 1)))
	if side == "pub" {
		m.Add(side+"_cpu_pgcdc_us/entry", benchenv.PerChange(cpu(benchenv.CPU, srcPid)-s0, events))
		m.Add(side+"_cpu_walsender_us/entry", benchenv.PerChange(cpu(benchenv.CPU, walsender)-w0, events))
		sio, wio := readSyscalls(srcPid), readSyscalls(walsender)
		m.Add(side+"_pgcdc_reads/entry", float64(sio.reads-sio0.reads)/float64(events))
		m.Add(side+"_walsender_reads/entry", float64(wio.reads-wio0.reads)/float64(events))
		m.Add(side+"_walsender_waits/entry", float64(wio.waits-wio0.waits)/float64(events))
	}
	return rate
}

// redisExecs is the number of EXECs Redis ran so far: one per queue write of either side.
func (e *pubEnv) redisExecs() int64 {
	rdb := e.rd.Client()
	defer rdb.Close()
	n, err := benchenv.RedisCalls(context.Background(), rdb, "exec")
	if err != nil {
		e.b.Fatal(err)
	}
	return n
}

// profileSource saves a CPU profile of pg_cdc over d to <PGRELAY_BENCH_PROFILE>/publish_pgcdc.pprof.
func (e *pubEnv) profileSource(d time.Duration) {
	url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", e.debugPort, int(d.Seconds()))
	body, err := testenv.HTTPGet(context.Background(), url, d+30*time.Second)
	if err == nil {
		err = os.MkdirAll(e.profileDir, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(e.profileDir, "publish_pgcdc.pprof"), []byte(body), 0o644)
	}
	if err != nil {
		e.b.Logf("no profile of pg_cdc: %v", err)
	}
}

// syscalls is a process' read system calls (/proc/<pid>/io: syscr, socket reads included) and
// voluntary context switches (/proc/<pid>/status: each a wait that ended in a wake-up) so far:
// pg_cdc's reads show how its reader takes the WAL, the walsender's waits how often it sleeps
// and is woken per event. (Its sends to the socket are not counted in syscw.)
type syscalls struct{ reads, waits int64 }

func readSyscalls(pid int) syscalls {
	var s syscalls
	for _, f := range []string{"io", "status"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch k {
			case "syscr":
				s.reads = n
			case "voluntary_ctxt_switches":
				s.waits = n
			}
		}
	}
	return s
}
