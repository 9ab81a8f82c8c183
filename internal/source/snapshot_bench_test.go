package source_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// snapshotBenchRows is the table size of BenchmarkSnapshot (PGRELAY_BENCH_SNAPSHOT_ROWS, default
// 300,000: the 1M scaled down for a 2-core machine shared with other work).
func snapshotBenchRows() int {
	if n, err := strconv.Atoi(os.Getenv("PGRELAY_BENCH_SNAPSHOT_ROWS")); err == nil && n > 0 {
		return n
	}
	return 300000
}

// BenchmarkSnapshot measures, in the same run, `COPY (SELECT ...) TO STDOUT` drained to nowhere
// (the ceiling: PostgreSQL printing the rows) and pg_cdc's snapshot of the same table into
// redis_queue (from the start of the pipeline to the pointer's snapshot becoming null), rows of
// about 200 bytes as JSON, default chunk_rows and bundle limits. PGRELAY_BENCH_SNAPSHOT_OUTPUT=drop
// measures the source alone (the drop output); PGRELAY_BENCH_SNAPSHOT_EXTRA adds pg_cdc fields.
// With redis_queue it also reports the Redis ceiling: the snapshot's entries XADDed again in plain
// pipelines (xadd_rows/s, and xadd_ratio to COPY).
func BenchmarkSnapshot(b *testing.B) {
	total := snapshotBenchRows()
	e := &env{t: b, pg: testenv.StartPostgres(b), rd: testenv.StartRedis(b, redisArgs()...), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE snap (id bigint PRIMARY KEY, v text, n numeric, ts timestamptz)`)
	e.pg.Exec(`INSERT INTO snap SELECT g, repeat(md5(g::text), 3), g * 1.5, now() FROM generate_series(1, $1::bigint) g`, total)
	e.pg.Exec(`VACUUM ANALYZE snap`)
	conn, err := pgconn.Connect(e.ctx, e.pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(e.ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := conn.CopyTo(e.ctx, io.Discard, `COPY (SELECT id, v, n, ts FROM snap ORDER BY id) TO STDOUT`); err != nil {
			b.Fatal(err)
		}
		copyTime := time.Since(start)
		name := "snapbench" + strconv.Itoa(i)
		start = time.Now()
		extra := "snapshot: initial\n" + os.Getenv("PGRELAY_BENCH_SNAPSHOT_EXTRA")
		var stop func()
		if os.Getenv("PGRELAY_BENCH_SNAPSHOT_OUTPUT") == "drop" { // the source alone: pointer written after each ack
			stop = startStream(b, fmt.Sprintf("input:\n  pg_cdc:\n    name: %s\n    dsn: %s\n    tls: {mode: disable}\n    tables: [{table: snap, queue: %s}]\n    redis: {url: %s}\n%s\noutput:\n  drop: {}\nlogger:\n  level: warn\n",
				name, e.pg.DSN(), name, e.rd.URL(), indent(extra)))
		} else {
			stop = e.run(name, `[{table: snap, queue: `+name+`}]`, extra)
		}
		e.waitPointer(name, name)
		e.waitSnapshotDone(name, name, 30*time.Minute)
		snapTime := time.Since(start)
		stop()
		copyRate, snapRate := float64(total)/copyTime.Seconds(), float64(total)/snapTime.Seconds()
		b.ReportMetric(copyRate, "copy_rows/s")
		b.ReportMetric(snapRate, "snapshot_rows/s")
		b.ReportMetric(snapRate/copyRate, "ratio")
		if os.Getenv("PGRELAY_BENCH_SNAPSHOT_OUTPUT") != "drop" {
			// The Redis ceiling under the same settings: the snapshot's entries XADDed again in
			// plain pipelines of 1,000 (no script, fence or pointer).
			xaddRate := float64(total) / rawXAdd(b, e, name).Seconds()
			b.ReportMetric(xaddRate, "xadd_rows/s")
			b.ReportMetric(xaddRate/copyRate, "xadd_ratio")
		}
	}
}
