package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkSourceTx1000-2   	       1	99632277027 ns/op	     28000 drop_changes/s	         7.000 drop_cpu_pgrelay_us/change	         0.5 drop_ratio	     30000 queue_changes/s	         8.000 queue_cpu_pgrelay_us/change	         2.500 queue_cpu_redis_us/change	         0.5 queue_ratio	     60000 raw_changes/s	         4.000 raw_cpu_walsender_us/change	2000 queue_alloc_bytes/change	20 queue_allocs/change	30 queue_gc_cycles
BenchmarkSourceLatency-2   	       1	1 ns/op	         9 p50_ms	       70 p99_ms	     -4000 p99_over_raw_ms	      2800 raw_p50_ms	      5000 raw_p99_ms
BenchmarkUpsert/batch=500-2         	       1	 551450891 ns/op	         0.95 ratio	     51251 sink_rows/s	     53000 unnest_rows/s
BenchmarkSnapshotUnderLoad-2   	       1	1 ns/op	  140000 idle_rows/s	 0.45 idle_pgrelay_cores	 0.64 idle_redis_cores	 0.14 idle_postgres_cores	 0.27 steady_pgrelay_cores	 0.37 steady_redis_cores	 0.91 steady_postgres_cores	 0.20 steady_pgbench_cores	 0.9 steady_waiting_pgbench_cores	 0.6 steady_waiting_redis_cores
ok  	github.com/pgrelay/pgrelay/internal/source	105.257s
BenchmarkSourceLargeTransactionRSS-2   	       1	30000000000 ns/op	        80.50 peak_rss_MiB	        40.25 rss_before_MiB	    110000 rows/s
`

func TestReportPlacesFiguresBesideBaselinesAndKeepsHandWrittenText(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "bench.txt")
	if err := os.WriteFile(out, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := parse([]string{out})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.get("BenchmarkUpsert/batch=500", "sink_rows/s"); v != 51251 {
		t.Fatalf("sub-benchmark figure: %v", v)
	}
	md := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(md, []byte("# Benchmarks\n\nintro\n\n"+beginMark+"\nold\n"+endMark+"\n\n## Where the CPU goes\n\nkept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := splice(md, generate(r, [][2]string{{"date", "today"}}, "")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(md)
	got := string(b)
	for _, want := range []string{
		"intro", "## Where the CPU goes\n\nkept", "| date | today |",
		// rate beside its baseline, the benchmark's own ratio
		"| pg_cdc → redis_queue, changes/s | 30,000 | pg_recvlogical, raw pgoutput | 60,000 | 0.50 |",
		// CPU: baseline ÷ value, judged against the goal
		"| pgrelay CPU per change → redis_queue, µs | 8.00 | decode (walsender of pg_recvlogical), µs | 4.00 | 0.50 | ≤ 3 µs | **no** |",
		"| redis-server CPU per change (durability aof), µs | 2.50 | decode, µs | 4.00 | 1.60 | ≤ 6 µs | yes |",
		"| upsert, 500-row batches, rows/s | 51,251 | hand-written unnest + ON CONFLICT | 53,000 | 0.95 | ≥ 0.9 | yes |",
		// the memory of one large transaction, judged against its ceiling
		"| peak RSS of the pgrelay binary, MiB | 80.5 | its RSS before the transaction, MiB | 40.2 | 0.50 | ≤ 128 MiB | yes |",
		// an overloaded machine's latency run is not judged
		"not valid: the baseline shows an overloaded machine",
		// the CPU table
		"| queue | 8.00 | 2.50 |",
		// the cores under load, pgbench's column after the servers'
		"| phase | pgrelay | redis | postgres | pgbench | waiting_redis | waiting_pgbench | rate |",
		"| idle | 0.45 | 0.64 | 0.14 |  |  |  | 140,000 rows/s |",
		"| steady | 0.27 | 0.37 | 0.91 | 0.20 | 0.60 | 0.90 |  |",
		// the allocation table
		"| SourceTx1000 | queue | 2000 | 20.0 | 30.0 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\nold\n") || strings.Count(got, beginMark) != 1 {
		t.Errorf("the generated part was not replaced exactly once:\n%s", got)
	}
}

// The publish p99 is judged against the writers' own statement time, not the outbox's p50 (a
// poller's p50 is its poll cycle, high on a calm machine).
func TestPublishLatencyValidity(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
	}{
		{"calm writers, slow outbox poll", "2.3 pub_p99_ms 5.1 outbox_p50_ms 0.4 pub_commit_p50_ms", "| ≤ 10 ms | yes |"},
		{"calm writers, p99 over the goal", "12 pub_p99_ms 5.1 outbox_p50_ms 0.4 pub_commit_p50_ms", "| ≤ 10 ms | **no** |"},
		{"starved writers", "2.3 pub_p99_ms 0.9 outbox_p50_ms 3.5 pub_commit_p50_ms", "| ≤ 10 ms | not valid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "bench.txt")
			if err := os.WriteFile(out, []byte("BenchmarkPublishOutbox-2 1 1 ns/op "+tc.line+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := parse([]string{out})
			if err != nil {
				t.Fatal(err)
			}
			got := generate(r, nil, "")
			var row string
			for _, l := range strings.Split(got, "\n") {
				if strings.Contains(l, "commit → queue entry p99") {
					row = l
				}
			}
			if !strings.Contains(row, tc.want) {
				t.Fatalf("publish p99 row %q lacks %q", row, tc.want)
			}
		})
	}
}
