package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// queueRow is one row of BenchmarkQueueToTable's table, as the queue carries it (JSON payload).
type queueRow struct {
	ID      int64   `json:"id"`
	Name    string  `json:"name"`
	Qty     int32   `json:"qty"`
	Version int32   `json:"version"`
	Price   float64 `json:"price"`
	Status  string  `json:"status"`
	Attrs   string  `json:"attrs"`
}

const queueBenchDDL = `CREATE TABLE %s (id bigint PRIMARY KEY, name text, qty int, version int, price float8, status text, attrs text)`

// BenchmarkQueueToTable measures the whole queue → table path through the pgrelay binary
// (redis_queue input, batches of 500 → pg_sink upsert) against a hand-written loop over the same
// entries in the same run: XREADGROUP COUNT 500 over the 16 shards, JSON decoded into typed
// arrays, INSERT … SELECT FROM unnest … ON CONFLICT and XACK, one transaction per read. The
// queue holds PGRELAY_BENCH_SINK_ROWS × 5 entries (100,000; 20,000 in quick mode) of 7-column
// rows; each run reads them in its own consumer group. Reported: medians of the rates, the ratio
// and the CPU time per row of pgrelay (the binary, counted from its first applied row: start-up
// excluded), the loop, redis-server and PostgreSQL.
func BenchmarkQueueToTable(b *testing.B) {
	n := 5 * benchenv.Size("PGRELAY_BENCH_SINK_ROWS", 20000, 4000)
	pg := testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off"))
	rd := testenv.StartRedis(b)
	ctx := context.Background()
	rdb := rd.Client()
	pm, err := benchenv.PostmasterPid(pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	rpid, err := benchenv.RedisPid(ctx, rdb)
	if err != nil {
		b.Fatal(err)
	}
	pg.Exec(fmt.Sprintf(queueBenchDDL, "sinkq"))
	pg.Exec(fmt.Sprintf(queueBenchDDL, "loopq"))
	w := queue.NewWriter(rdb, queue.WriterConfig{Shards: 16})
	for i := 0; i < n; i += 1000 {
		msgs := make([]queue.Message, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			r := queueRow{ID: int64(j + 1), Name: "item-" + strconv.Itoa(j), Qty: int32(j % 1000), Version: 1, Price: float64(j%10000) / 7,
				Status: []string{"new", "paid", "sent"}[j%3], Attrs: fmt.Sprintf(`{"color": "c%d"}`, j%17)}
			payload, _ := json.Marshal(r)
			msgs = append(msgs, queue.Message{Queue: "q", Partition: strconv.Itoa(j), ID: "m" + strconv.Itoa(j), CreatedMs: 1700000000000, Payload: payload})
		}
		if _, err := w.Write(ctx, msgs, nil); err != nil {
			b.Fatal(err)
		}
	}
	bin := testenv.Binary(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < benchenv.Runs(); r++ {
			loop := queueLoop(b, pg.Pool(), rdb, pm, rpid, fmt.Sprintf("loop%d_%d", i, r), n)
			sink := queueSink(b, pg, rd, bin, pm, rpid, fmt.Sprintf("sink%d_%d", i, r), n)
			m.Add("loop_rows/s", loop.rate)
			m.Add("sink_rows/s", sink.rate)
			m.Add("ratio", sink.rate/loop.rate)
			m.Add("sink_cpu_pgrelay_us/row", sink.self)
			m.Add("sink_cpu_redis_us/row", sink.redis)
			m.Add("sink_cpu_postgres_us/row", sink.postgres)
			m.Add("loop_cpu_client_us/row", loop.self)
			m.Add("loop_cpu_redis_us/row", loop.redis)
			m.Add("loop_cpu_postgres_us/row", loop.postgres)
		}
		m.Report(b)
	}
}

// pathCost is one side's rate and CPU µs per row.
type pathCost struct{ rate, self, redis, postgres float64 }

func cpuNow(b *testing.B, read func(int) (time.Duration, error), pid int) time.Duration {
	d, err := read(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// queueLoop is the hand-written baseline: it reads the whole queue in consumer group group.
func queueLoop(b *testing.B, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, rdb *redis.Client, pm, rpid int, group string, n int) pathCost {
	ctx := context.Background()
	l := queue.NewLayout("")
	streams := make([]string, 0, 32)
	for s := 0; s < 16; s++ {
		if err := rdb.XGroupCreate(ctx, l.Stream("q", s), group, "0").Err(); err != nil {
			b.Fatal(err)
		}
		streams = append(streams, l.Stream("q", s))
	}
	for s := 0; s < 16; s++ {
		streams = append(streams, ">")
	}
	sql := `INSERT INTO loopq (id, name, qty, version, price, status, attrs)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::int[], $5::float8[], $6::text[], $7::text[])
		ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty, version = EXCLUDED.version,
		price = EXCLUDED.price, status = EXCLUDED.status, attrs = EXCLUDED.attrs`
	pg0, r0, c0, t0 := cpuNow(b, benchenv.TreeCPU, pm), cpuNow(b, benchenv.CPU, rpid), benchenv.SelfCPU(), time.Now()
	for got := 0; got < n; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: streams, Count: 500, Block: -1}).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range res {
			if len(st.Messages) == 0 {
				continue
			}
			acks := make([]string, len(st.Messages))
			var es []queue.Entry // the messages of the entries (a layout-3 entry holds several)
			for j, msg := range st.Messages {
				es = queue.EntriesOf(es, msg)
				acks[j] = msg.ID
			}
			k := len(es)
			ids, names, qtys, vers, prices, stats, attrs := make([]int64, k), make([]string, k), make([]int32, k), make([]int32, k),
				make([]float64, k), make([]string, k), make([]string, k)
			for j, e := range es {
				var row queueRow
				if err := json.Unmarshal(e.Payload, &row); err != nil {
					b.Fatal(err)
				}
				ids[j], names[j], qtys[j], vers[j], prices[j], stats[j], attrs[j] = row.ID, row.Name, row.Qty, row.Version, row.Price, row.Status, row.Attrs
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, sql, ids, names, qtys, vers, prices, stats, attrs); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			if err := rdb.XAck(ctx, st.Stream, group, acks...).Err(); err != nil {
				b.Fatal(err)
			}
			got += k
		}
	}
	elapsed := time.Since(t0)
	return pathCost{rate: float64(n) / elapsed.Seconds(), self: benchenv.PerChange(benchenv.SelfCPU()-c0, n),
		redis: benchenv.PerChange(cpuNow(b, benchenv.CPU, rpid)-r0, n), postgres: benchenv.PerChange(cpuNow(b, benchenv.TreeCPU, pm)-pg0, n)}
}

// queueSink runs the binary's redis_queue → pg_sink upsert pipeline in consumer group name until
// its progress rows cover the queue; the window starts at its first applied row. With
// PGRELAY_BENCH_PROFILE set, the binary's CPU profile over the first 3 s of the window is saved
// there as queue_to_table_<name>.pprof (through Benthos' debug endpoints).
func queueSink(b *testing.B, pg *testenv.Postgres, rd *testenv.Redis, bin string, pm, rpid int, name string, n int) pathCost {
	ctx := context.Background()
	httpConf := "{ enabled: false }"
	profileDir := os.Getenv("PGRELAY_BENCH_PROFILE")
	port := 0
	if profileDir != "" {
		port = testenv.FreePort(b)
		httpConf = fmt.Sprintf("{ address: 127.0.0.1:%d, debug_endpoints: true }", port)
	}
	config := fmt.Sprintf(`
http: %s
logger: { level: warn }
input:
  redis_queue:
    url: %s
    queue: q
    group: %s
    start_from: earliest
    batch_count: 500
output:
  pg_sink:
    dsn: %q
    name: %s
    table: public.sinkq
    mode: upsert
`, httpConf, rd.URL(), name, pg.DSN(), name)
	path := filepath.Join(b.TempDir(), "sink.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		b.Fatal(err)
	}
	p := testenv.StartProcess(b, nil, bin, "-c", path)
	defer p.Kill()
	applied := func() int64 {
		var sum int64
		_ = pg.Pool().QueryRow(ctx, `SELECT coalesce(sum(last_offset), 0) FROM pgrelay.sink_progress WHERE sink = $1`, name).Scan(&sum)
		return sum
	}
	var n0 int64
	cdctest.WaitEvery(b, 10*time.Minute, 2*time.Millisecond, name+" to apply something", func() (bool, string) {
		n0 = applied()
		return n0 > 0, p.Output()
	})
	pg0, r0, s0, t0 := cpuNow(b, benchenv.TreeCPU, pm), cpuNow(b, benchenv.CPU, rpid), cpuNow(b, benchenv.CPU, p.Pid()), time.Now()
	var profiled sync.WaitGroup
	if profileDir != "" {
		profiled.Go(func() {
			profileBinary(b, port, filepath.Join(profileDir, "queue_to_table_"+name+".pprof"), 3*time.Second)
		})
	}
	defer profiled.Wait()
	cdctest.WaitEvery(b, 10*time.Minute, 5*time.Millisecond, name+" to catch up", func() (bool, string) {
		return applied() >= int64(n), p.Output()
	})
	elapsed := time.Since(t0)
	rows := n - int(n0)
	return pathCost{rate: float64(rows) / elapsed.Seconds(), self: benchenv.PerChange(cpuNow(b, benchenv.CPU, p.Pid())-s0, rows),
		redis: benchenv.PerChange(cpuNow(b, benchenv.CPU, rpid)-r0, rows), postgres: benchenv.PerChange(cpuNow(b, benchenv.TreeCPU, pm)-pg0, rows)}
}

// profileBinary saves a CPU profile of d of the binary whose debug endpoints listen on port, then
// its allocations since it started (path with .allocs before the extension), to see which
// component's allocations the garbage collector pays for.
func profileBinary(b *testing.B, port int, path string, d time.Duration) {
	base := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", port)
	allocs := strings.TrimSuffix(path, filepath.Ext(path)) + ".allocs" + filepath.Ext(path)
	for _, p := range []struct{ url, path string }{{fmt.Sprintf("%sprofile?seconds=%d", base, int(d.Seconds())), path}, {base + "allocs", allocs}} {
		body, err := testenv.HTTPGet(context.Background(), p.url, d+30*time.Second)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(p.path), 0o755)
		}
		if err == nil {
			err = os.WriteFile(p.path, []byte(body), 0o644)
		}
		if err != nil {
			b.Logf("no profile of the binary: %v", err)
		}
	}
}
