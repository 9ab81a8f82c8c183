package tests

import (
	"hash/crc32"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// BenchmarkSourceLargeTransactionRSS streams one transaction of PGRELAY_BENCH_BIG_ROWS rows
// (2,000,000; 200,000 in quick mode) through the pgrelay binary into redis_queue and reports the process's peak
// RSS (VmHWM) and the rate; the reader holds at most 2× the bundle limits whatever the size.
// PGRELAY_BENCH_MAX_IN_FLIGHT sets the output's max_in_flight, PGRELAY_BENCH_LAYOUT its layout_version.
func BenchmarkSourceLargeTransactionRSS(b *testing.B) {
	rows := benchenv.Size("PGRELAY_BENCH_BIG_ROWS", 2000000, 200000)
	for i := 0; i < b.N; i++ {
		pg := testenv.StartPostgres(b)
		e := newCDCEnvWith(b, pg, pg.DSN(), "rss", `[{table: b, queue: q, partition_by: single}]`, func(p *cdctest.Pipeline, _ *testenv.Redis) {
			var extra []string
			if n := os.Getenv("PGRELAY_BENCH_MAX_IN_FLIGHT"); n != "" {
				extra = append(extra, "max_in_flight: "+n)
			}
			if v := os.Getenv("PGRELAY_BENCH_LAYOUT"); v != "" {
				extra = append(extra, "layout_version: "+v)
			}
			p.Output = strings.Join(extra, "\n")
		})
		e.pg.Exec(`CREATE TABLE b (id int PRIMARY KEY, v text)`)
		e.start()
		e.waitPointer()
		pid := pidOfOwner(e)
		before := vmHWM(pid)
		e.pg.Exec(`INSERT INTO b SELECT g, 'row ' || g FROM generate_series(1, $1) g`, rows)
		start := time.Now()
		for {
			// the shard's last offset counts messages (a layout-3 entry holds several)
			written, _ := e.rd.Client().HGet(e.ctx, "pgrelay:{q}:meta", "off:"+shardOfAll()).Int()
			if p := e.pointer(); p != nil && p.InTxn == nil && written >= rows {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		elapsed := time.Since(start)
		peak := vmHWM(pid)
		b.ReportMetric(float64(peak)/(1<<20), "peak_rss_MiB")
		b.ReportMetric(float64(before)/(1<<20), "rss_before_MiB")
		b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
	}
}

// shardOfAll is the shard of partition "all" in a 16-shard queue (CRC-32 IEEE mod 16).
func shardOfAll() string {
	return strconv.Itoa(int(crc32IEEE("all") % 16))
}

// pidOfOwner reads the lease holder's pid (owner ids are host:pid:random).
func pidOfOwner(e *cdcEnv) int {
	o, _, _ := lease.Holder(e.ctx, e.rd.Client(), e.leaseKey())
	parts := strings.Split(o, ":")
	if len(parts) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[1])
	return pid
}

// vmHWM reads a process's peak resident set size in bytes.
func vmHWM(pid int) int64 { return procStatusKB(pid, "VmHWM") * 1024 }

func crc32IEEE(s string) uint32 { return crc32.ChecksumIEEE([]byte(s)) }
