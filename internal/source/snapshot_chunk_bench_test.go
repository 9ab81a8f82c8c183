package source

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkSnapshotChunks reads BenchmarkSnapshot's table (PGRELAY_BENCH_SNAPSHOT_ROWS rows,
// 300,000; 20,000 in quick mode) chunk by chunk between watermarks and renders its rows as `r`
// events, nothing else of the pipeline, alternating in each of PGRELAY_BENCH_RUNS runs:
//
//   - stream: the snapshotter's way, each row rendered as it arrives and completed at the end of
//     its chunk's round trip;
//   - after: the chunk received whole, then its rows rendered (the fallback path).
//
// It reports, per row, the CPU time of this process (the read and the rendering) and of the
// PostgreSQL server (the chunk reads), the read system calls of this process and what it
// allocated, and the rows/s of each.
func BenchmarkSnapshotChunks(b *testing.B) {
	total := benchenv.Size("PGRELAY_BENCH_SNAPSHOT_ROWS", 300000, 20000)
	runs := benchenv.Runs()
	defer benchenv.RuntimeLikeBinary()()
	pg := testenv.StartPostgres(b, testenv.WithPGSetting("autovacuum = off"))
	ctx := context.Background()
	pg.Exec(`CREATE TABLE snap (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	pg.Exec(`INSERT INTO snap SELECT g, repeat(md5(g::text), 3), g * 1.5, now() FROM generate_series(1, $1::bigint) g`, total)
	pg.Exec(`VACUUM ANALYZE snap`)
	pg.Exec(`CHECKPOINT`)
	pm, err := benchenv.PostmasterPid(pg.DataDir)
	if err != nil {
		b.Fatal(err)
	}
	pcfg, err := (&pgconnect.Config{DSN: pg.DSN()}).PoolConfig(2)
	if err != nil {
		b.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	tables, _, err := LoadTables(ctx, pool, []Table{{Schema: "public", Name: "snap", Queue: "q", Mode: PartitionByKey}}, 170000)
	if err != nil {
		b.Fatal(err)
	}
	sn := &snapshotter{ss: testSession(1000, pointer.Pointer{}), pool: pool, epoch: "e", reg: convert.NewRegistry(), life: "bench",
		flushArg: pg.Version >= 17, tables: map[string]*snapTable{"public.snap": {info: &tables[0], full: "public.snap"}},
		bufs: make(chan *snapshot.Buffers, 1)}
	sn.ss.src.cfg.ChunkRows = 2000
	tab, err := sn.load(ctx, "public.snap")
	if err != nil {
		b.Fatal(err)
	}
	// pass reads the whole table once, rendering each chunk's rows as they arrive or after.
	rr := &rowRender{}
	pass := func(stream bool) (rows int) {
		cur, _ := snapshot.Start([]string{"public.snap"})
		for n := 0; ; n++ {
			p := &pendingChunk{id: "bench:" + strconv.Itoa(n), table: tab, cursor: cur}
			render := rr
			if stream {
				rr.reset(tab)
			} else {
				render = nil
			}
			ch, hw, err := sn.readBetween(ctx, tab, cur, p.id, render)
			if err != nil {
				b.Fatal(err)
			}
			p.chunk = ch
			var events []Event
			if stream {
				events, _ = rr.finish(sn.tx(hw), sn.position(hw, ch), ch.ReadAt.UnixMilli())
			} else {
				events, _ = sn.render(p, hw)
			}
			if len(events) != ch.Rows.Len() {
				b.Fatalf("%d events for %d rows", len(events), ch.Rows.Len())
			}
			rows += ch.Rows.Len()
			tab.measure(&ch.Rows) // sizes the next chunk, as the snapshotter's prepare does
			next, over := cur.Advance(ch.Rows.Len(), ch.LastKey, ch.Limit)
			sn.bufs <- ch.Buffers // the chunk's memory to the next read, as the snapshotter's hand-over does
			if over || next.Table != cur.Table {
				return rows
			}
			cur = next
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for r := 0; r < runs; r++ {
			for _, mode := range []struct {
				name   string
				stream bool
			}{{"after", false}, {"stream", true}} {
				self, server, reads := benchenv.SelfCPU(), cpuTree(b, pm), benchenv.SelfReadCalls(b)
				var mem0, mem1 runtime.MemStats
				runtime.ReadMemStats(&mem0)
				start := time.Now()
				if n := pass(mode.stream); n != total {
					b.Fatalf("%s: read %d rows of %d", mode.name, n, total)
				}
				elapsed := time.Since(start)
				runtime.ReadMemStats(&mem1)
				m.Add(mode.name+"_reads/row", float64(benchenv.SelfReadCalls(b)-reads)/float64(total))
				m.Add(mode.name+"_alloc_bytes/row", float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(total))
				m.Add(mode.name+"_allocs/row", float64(mem1.Mallocs-mem0.Mallocs)/float64(total))
				m.Add(mode.name+"_rows/s", float64(total)/elapsed.Seconds())
				m.Add(mode.name+"_cpu_pgrelay_us/row", benchenv.PerChange(benchenv.SelfCPU()-self, total))
				m.Add(mode.name+"_cpu_postgres_us/row", benchenv.PerChange(cpuTree(b, pm)-server, total))
			}
		}
		m.Report(b)
	}
}

func cpuTree(b *testing.B, pid int) time.Duration {
	d, err := benchenv.TreeCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
