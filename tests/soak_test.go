package tests

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSoakSteadyLoad is the opt-in soak run (`make soak`, scripts/soak; not in CI): for
// PGRELAY_SOAK_DURATION (e.g. 30m), PGRELAY_SOAK_REPLICAS replicas (default 2: the source's owner
// and a standby, the sink shards split between them) run `pgrelay streams` with pgbench's three
// keyed tables streamed and copied (pgbenchEnv), under a steady pgbench load
// of PGRELAY_SOAK_RATE transactions per second (default 100, -c 4 -j 2), with queue retention
// (max_age 2m). Every PGRELAY_SOAK_EVERY (default 10s) it samples each process's resident set
// (/proc/<pid>/status VmRSS), Go heap in use and goroutines (go_memstats_heap_inuse_bytes and
// go_goroutines from its /metrics), open file descriptors and sockets (/proc/<pid>/fd). After the first sixth of the run (warm-up: the initial snapshot,
// pools and Go's heap reaching their working size) it fits a least-squares line to each series:
// the fitted change over the rest of the run must stay within 10 % of the series' mean (at least
// 8 MiB, 5 goroutines, 3 descriptors); the logs hold no error line; and the copy equals the source
// when the load stops. PGRELAY_SOAK_OUT names a directory for samples.csv, report.md and each
// replica's heap profile after the warm-up and at the end.
func TestSoakSteadyLoad(t *testing.T) {
	dur := envDuration(t, "PGRELAY_SOAK_DURATION", 0)
	if dur == 0 {
		t.Skip("opt-in soak run: set PGRELAY_SOAK_DURATION (make soak)")
	}
	every := envDuration(t, "PGRELAY_SOAK_EVERY", 10*time.Second)
	rate := envInt(t, "PGRELAY_SOAK_RATE", 100)
	n := envInt(t, "PGRELAY_SOAK_REPLICAS", 2)
	warmup := dur / 6
	t.Logf("soak: %s at %d tx/s, %d replicas, a sample every %s, fit after %s; load average %s", dur, rate, n, every, warmup, loadAverage())

	e := newPgbenchEnv(t, pgbenchOptions{leaseTTL: "10s", outputExtra: "max_age: 2m\ntrim_interval: 30s"})
	var replicas []*replica
	for i := 0; i < n; i++ {
		replicas = append(replicas, e.newReplica(i))
	}
	e.waitPointer()
	load := e.startLoad(dur, rate)
	start := time.Now()
	var samples []soakSample
	var loads []string
	out := os.Getenv("PGRELAY_SOAK_OUT")
	profiled := false
	for time.Since(start) < dur {
		time.Sleep(every)
		at := time.Since(start)
		if out != "" && !profiled && at >= warmup {
			profiled = true
			saveHeapProfiles(t, e, replicas, out, "warm")
		}
		for _, r := range replicas {
			if r.p.Exited() {
				t.Fatalf("replica %d ended: %s", r.n, sinkLastLines(r.p.Output(), 10))
			}
			samples = append(samples, sampleProcess(e, r, at))
		}
		loads = append(loads, loadAverage())
	}
	if out != "" {
		saveHeapProfiles(t, e, replicas, out, "end")
	}
	if err := load.Wait(5 * time.Minute); err != nil {
		t.Fatalf("pgbench: %v\n%s", err, load.Output())
	}
	t.Logf("pgbench: %s tps; load average %s", pgbenchTPS(load.Output()), loadAverage())
	e.waitCaughtUp(5 * time.Minute)

	report := soakReport(t, replicas, samples, warmup, dur)
	var errorLines []string
	for _, r := range replicas {
		for _, line := range strings.Split(r.p.Output(), "\n") {
			if strings.Contains(line, "level=error") || strings.Contains(line, "panic:") {
				errorLines = append(errorLines, fmt.Sprintf("replica %d: %s", r.n, line))
			}
		}
	}
	report += fmt.Sprintf("\nerror lines in the logs: %d; copy equal to the source (md5 per row) after the load; pgbench %s tps; load average at the samples %s … %s\n",
		len(errorLines), pgbenchTPS(load.Output()), loads[0], loads[len(loads)-1])
	t.Log("\n" + report)
	for i, l := range errorLines {
		if i < 20 {
			t.Error(l)
		}
	}
	if out != "" {
		writeSoakFiles(t, out, samples, report)
	}
}

// soakSample is one process's figures at one moment.
type soakSample struct {
	replica    int
	at         time.Duration // since the load started
	rss        float64       // MiB
	heap       float64       // MiB of Go heap in use (go_memstats_heap_inuse_bytes)
	goroutines float64
	fds        float64
	sockets    float64
}

func sampleProcess(e *pgbenchEnv, r *replica, at time.Duration) soakSample {
	s := soakSample{replica: r.n, at: at, rss: float64(procStatusKB(r.p.Pid(), "VmRSS")) / 1024}
	s.fds, s.sockets = openFDs(r.p.Pid())
	body, err := testenv.HTTPGet(e.ctx, r.metricsURL(), 10*time.Second)
	if err != nil {
		e.t.Fatalf("replica %d metrics: %v", r.n, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			s.goroutines, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			b, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			s.heap = b / (1 << 20)
		}
	}
	if s.goroutines == 0 {
		e.t.Fatalf("replica %d: no go_goroutines on %s", r.n, r.metricsURL())
	}
	return s
}

// procStatusKB reads a "Name:  N kB" field of /proc/<pid>/status.
func procStatusKB(pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb
		}
	}
	return 0
}

// openFDs counts a process's open file descriptors and, among them, its sockets.
func openFDs(pid int) (fds, sockets float64) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0
	}
	for _, en := range entries {
		fds++
		if link, err := os.Readlink(filepath.Join(dir, en.Name())); err == nil && strings.HasPrefix(link, "socket:") {
			sockets++
		}
	}
	return fds, sockets
}

// soakSeries names each figure with the floor of its flatness limit.
var soakSeries = []struct {
	name, unit string
	floor      float64
	get        func(soakSample) float64
}{
	{"RSS", "MiB", 8, func(s soakSample) float64 { return s.rss }},
	{"Go heap in use", "MiB", 8, func(s soakSample) float64 { return s.heap }},
	{"goroutines", "", 5, func(s soakSample) float64 { return s.goroutines }},
	{"open fds", "", 3, func(s soakSample) float64 { return s.fds }},
	{"sockets", "", 3, func(s soakSample) float64 { return s.sockets }},
}

// soakReport fits each series of each replica after the warm-up, fails the test for any that is
// not flat, and returns the report as a Markdown table.
func soakReport(t *testing.T, replicas []*replica, samples []soakSample, warmup, dur time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| replica | figure | at %s | at end | min | max | slope per hour (fit after %s) | fitted change over the fit |\n|---|---|---|---|---|---|---|---|\n",
		warmup.Round(time.Second), warmup.Round(time.Second))
	for _, r := range replicas {
		for _, s := range soakSeries {
			var xs, ys []float64
			var all []float64
			for _, sm := range samples {
				if sm.replica != r.n {
					continue
				}
				all = append(all, s.get(sm))
				if sm.at >= warmup {
					xs, ys = append(xs, sm.at.Hours()), append(ys, s.get(sm))
				}
			}
			if len(ys) < 3 {
				t.Fatalf("only %d samples after the warm-up", len(ys))
			}
			slope, mean := leastSquares(xs, ys)
			change := slope * (xs[len(xs)-1] - xs[0])
			lo, hi := all[0], all[0]
			for _, v := range all {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %+.2f%s/h | %+.1f%% of the mean |\n", r.n, s.name, fmtFig(ys[0], s.unit),
				fmtFig(ys[len(ys)-1], s.unit), fmtFig(lo, s.unit), fmtFig(hi, s.unit), slope, unitSuffix(s.unit), 100*change/mean)
			if limit := math.Max(0.10*mean, s.floor); math.Abs(change) > limit {
				t.Errorf("replica %d %s is not flat: %+.1f%s over %s after the warm-up (limit %.1f)", r.n, s.name, change, unitSuffix(s.unit), dur-warmup, limit)
			}
		}
	}
	return b.String()
}

func fmtFig(v float64, unit string) string {
	if unit == "MiB" {
		return fmt.Sprintf("%.1f MiB", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func unitSuffix(unit string) string {
	if unit == "" {
		return ""
	}
	return " " + unit
}

// leastSquares returns the slope of the least-squares line through (xs, ys) and the mean of ys.
func leastSquares(xs, ys []float64) (slope, mean float64) {
	var sx, sy float64
	for i := range xs {
		sx, sy = sx+xs[i], sy+ys[i]
	}
	n := float64(len(xs))
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0, my
	}
	return sxy / sxx, my
}

func writeSoakFiles(t *testing.T, dir string, samples []soakSample, report string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("replica,seconds,rss_mib,heap_inuse_mib,goroutines,fds,sockets\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%d,%.0f,%.1f,%.1f,%.0f,%.0f,%.0f\n", s.replica, s.at.Seconds(), s.rss, s.heap, s.goroutines, s.fds, s.sockets)
	}
	for name, body := range map[string]string{"samples.csv": b.String(), "report.md": report} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLeastSquares(t *testing.T) {
	for _, c := range []struct {
		xs, ys      []float64
		slope, mean float64
	}{
		{[]float64{0, 1, 2}, []float64{5, 5, 5}, 0, 5},
		{[]float64{0, 0.5, 1}, []float64{10, 15, 20}, 10, 15},
		{[]float64{0, 1, 2, 3}, []float64{1, 0, 1, 0}, -0.2, 0.5},
		{[]float64{1, 1}, []float64{2, 4}, 0, 3},
	} {
		slope, mean := leastSquares(c.xs, c.ys)
		if math.Abs(slope-c.slope) > 1e-9 || math.Abs(mean-c.mean) > 1e-9 {
			t.Errorf("leastSquares(%v, %v) = %v, %v; want %v, %v", c.xs, c.ys, slope, mean, c.slope, c.mean)
		}
	}
}

// saveHeapProfiles writes each replica's heap profile (/debug/pprof/heap) to
// dir/heap-replica<n>-<when>.pprof: `go tool pprof -base heap-replica1-warm.pprof
// heap-replica1-end.pprof` shows what grew.
func saveHeapProfiles(t *testing.T, e *pgbenchEnv, replicas []*replica, dir, when string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", r.port), 30*time.Second)
		if err != nil {
			t.Errorf("replica %d heap profile: %v", r.n, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("heap-replica%d-%s.pprof", r.n, when)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
