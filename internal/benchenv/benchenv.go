// Package benchenv holds what pgrelay's benchmarks share: the CPU time of each process of a
// pipeline read from /proc (pgrelay, redis-server, a walsender, a whole PostgreSQL server), the
// pids to read it from, the benchmark sizes of the quick and the full mode, and medians over
// alternating runs.
//
// CPU seconds per change are what the benchmarks report beside throughput: on a machine shared
// with other work a process' CPU time per change moves far less than its rate does.
package benchenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/gctune"
	"github.com/pgrelay/pgrelay/internal/proctune"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// clockTick is USER_HZ, the unit of the times in /proc/<pid>/stat (100 on every Linux port).
const clockTick = 100

// procTimes reads utime, stime, cutime and cstime of pid (fields 14-17 of /proc/<pid>/stat).
func procTimes(pid int) (own, children time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields after it start past the
	// last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var t [4]int64
	for k := range t {
		if t[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, 14+k, err)
		}
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / clockTick }
	return tick(t[0] + t[1]), tick(t[2] + t[3]), nil
}

// ReadCalls is the number of read system calls pid has made so far (syscr of /proc/<pid>/io;
// socket reads included).
func ReadCalls(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io: no syscr", pid)
}

// SelfReadCalls is ReadCalls of this process; an error fails tb.
func SelfReadCalls(tb testing.TB) int64 {
	n, err := ReadCalls(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// CPU is the user + system CPU time pid has used so far.
func CPU(pid int) (time.Duration, error) {
	own, _, err := procTimes(pid)
	return own, err
}

// TreeCPU is the CPU time of pid and everything it started: its own, its live descendants', and
// that of the children they have already waited for (cutime + cstime). For a PostgreSQL
// postmaster that is the whole server, backends that exited during the window included.
func TreeCPU(pid int) (time.Duration, error) {
	own, reaped, err := procTimes(pid)
	if err != nil {
		return 0, err
	}
	total := own + reaped
	for _, c := range testenv.Descendants(pid) {
		if o, r, err := procTimes(c); err == nil { // a process may exit meanwhile: its parent reaps it
			total += o + r
		}
	}
	return total, nil
}

// Tree is TreeCPU for many short windows: it lists the tree's processes once, and again on
// Refresh, instead of at every reading, so a reading opens a few stat files rather than one per
// process of the machine (whose garbage would be collected inside the next measured window of
// the benchmark process). A process started since the last Refresh is not counted until it
// exits (then its parent's reaped time holds it) or the next Refresh.
type Tree struct {
	root int
	pids []int
}

// NewTree lists the processes below root.
func NewTree(root int) *Tree {
	t := &Tree{root: root}
	t.Refresh()
	return t
}

// Refresh lists the tree's processes again.
func (t *Tree) Refresh() { t.pids = testenv.Descendants(t.root) }

// CPU is TreeCPU over the listed processes.
func (t *Tree) CPU() (time.Duration, error) {
	own, reaped, err := procTimes(t.root)
	if err != nil {
		return 0, err
	}
	total := own + reaped
	for _, c := range t.pids {
		if o, r, err := procTimes(c); err == nil {
			total += o + r
		}
	}
	return total, nil
}

// Waits reads how long the threads of a set of processes stood runnable in the CPU's run queue
// without running (the second field of /proc/<pid>/task/<tid>/schedstat): time a process wanted a
// core and did not get one. A window's wait is Since on a Waits taken at its start; it covers the
// processes alive at the window's end (one that exited inside the window is not counted).
type Waits map[int]time.Duration

// ReadWaits reads the run-queue wait of each of pids, all threads summed.
func ReadWaits(pids ...int) Waits {
	w := Waits{}
	for _, pid := range pids {
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			continue // exited
		}
		var sum time.Duration
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/schedstat")
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) >= 2 {
				if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					sum += time.Duration(ns)
				}
			}
		}
		w[pid] = sum
	}
	return w
}

// Since is the run-queue wait pids spent since w was read (a process not in w counts whole).
func (w Waits) Since(pids ...int) time.Duration {
	var d time.Duration
	for pid, now := range ReadWaits(pids...) {
		d += now - w[pid]
	}
	return d
}

// SelfCPU is the CPU time of this process (all threads), for pipelines run in-process: what the
// binary's processor tuner reads (0 where it cannot be read).
func SelfCPU() time.Duration {
	d, _ := proctune.ProcessCPU()
	return d
}

// PostmasterPid is the pid of the PostgreSQL server of dataDir (first line of postmaster.pid).
func PostmasterPid(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// WatchRedisFsync makes the Redis of rdb record each AOF fsync of 1 ms or more (its latency
// monitor) and forgets those recorded so far: RedisFsyncMax then reads the slowest since. With
// appendfsync always every queue write waits for one, so a disk that stalls shows here.
func WatchRedisFsync(ctx context.Context, rdb *redis.Client) error {
	if err := rdb.ConfigSet(ctx, "latency-monitor-threshold", "1").Err(); err != nil {
		return err
	}
	return rdb.Do(ctx, "LATENCY", "RESET").Err()
}

// RedisFsyncMax is the slowest AOF fsync (appendfsync always: latency event aof-fsync-always), in
// ms, since WatchRedisFsync; 0 when none took 1 ms.
func RedisFsyncMax(ctx context.Context, rdb *redis.Client) (float64, error) {
	rows, err := rdb.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return 0, err
	}
	for _, row := range rows {
		// event name, time of the latest, the latest and the slowest, in ms
		if f, ok := row.([]any); ok && len(f) == 4 && f[0] == "aof-fsync-always" {
			if max, ok := f[3].(int64); ok {
				return float64(max), nil
			}
		}
	}
	return 0, nil
}

// RedisCalls is how many times the Redis of rdb ran command cmd (lower case, as INFO
// commandstats names it) since it started or the statistics were reset.
func RedisCalls(ctx context.Context, rdb *redis.Client, cmd string) (int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			return strconv.ParseInt(n, 10, 64)
		}
	}
	return 0, nil // never run
}

// RedisPid is the pid of the redis-server rdb talks to (INFO server process_id).
func RedisPid(ctx context.Context, rdb *redis.Client) (int, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// WalsenderPid is the pid of the walsender streaming replication slot slot, if one is. (A slot's
// active_pid alone may be an ordinary backend: pg_create_logical_replication_slot holds the slot
// for the session that creates it.)
func WalsenderPid(ctx context.Context, pool *pgxpool.Pool, slot string) (int, error) {
	var pid int32
	err := pool.QueryRow(ctx, `SELECT s.active_pid FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid AND a.backend_type = 'walsender'
		WHERE s.slot_name = $1`, slot).Scan(&pid)
	return int(pid), err
}

// SlotPid waits up to timeout for a walsender to stream replication slot slot and returns its pid.
func SlotPid(ctx context.Context, pool *pgxpool.Pool, slot string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		pid, err := WalsenderPid(ctx, pool, slot)
		if err == nil && pid != 0 {
			return pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no walsender on slot %s after %s (%v)", slot, timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Sampler follows the CPU time of a process that may exit before it can be read at the end of
// the measured window (a walsender whose client stops at an end position): it reads it every few
// milliseconds and keeps the last reading.
type Sampler struct {
	stop chan struct{}
	done chan time.Duration
}

// Sample starts following pid.
func Sample(pid int) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan time.Duration, 1)}
	go func() {
		var last time.Duration
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			if d, err := CPU(pid); err == nil {
				last = d
			} else {
				s.done <- last // the process is gone: its last reading stands
				return
			}
			select {
			case <-s.stop:
				if d, err := CPU(pid); err == nil {
					last = d
				}
				s.done <- last
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the last CPU time read.
func (s *Sampler) Stop() time.Duration {
	close(s.stop)
	return <-s.done
}

// Quick reports whether the benchmarks run in quick mode (PGRELAY_BENCH_QUICK=1): small sizes, a
// smoke run of seconds.
func Quick() bool { return os.Getenv("PGRELAY_BENCH_QUICK") == "1" }

// PGDSN is how a benchmark's clients reach pg: over its Unix socket when PGRELAY_BENCH_PG_SOCKET
// is set, else TCP on 127.0.0.1.
func PGDSN(pg *testenv.Postgres) string {
	if os.Getenv("PGRELAY_BENCH_PG_SOCKET") != "" {
		return pg.SocketDSN()
	}
	return pg.DSN()
}

// Size is the integer in environment variable name, else quick in quick mode, else full.
func Size(name string, full, quick int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	if Quick() {
		return quick
	}
	return full
}

// Runs is how many alternating runs a benchmark makes inside one iteration (PGRELAY_BENCH_RUNS;
// 3 in full mode, 1 in quick mode); it reports the medians.
func Runs() int { return Size("PGRELAY_BENCH_RUNS", 3, 1) }

// RuntimeLikeBinary gives this process the pgrelay binary's collector goal (internal/gctune) and
// Go processors, for the benchmarks that run pgrelay's pipeline in-process; the returned func
// restores Go's. The processors are one, as the binary keeps them while its work fits in a core
// (internal/proctune): each pipeline of these benchmarks runs for seconds at most, below the
// tuner's threshold, and the tuner itself would read this process's own work (building a
// baseline's commands, reading back a queue) as pgrelay's. Like the binary, it leaves the
// collector alone when GOGC or GOMEMLIMIT is set, and the processors when GOMAXPROCS is.
func RuntimeLikeBinary() func() {
	stopGC := func() {}
	if gctune.Enabled() {
		stopGC = gctune.Start(gctune.Headroom)
	}
	procs := runtime.GOMAXPROCS(0)
	if proctune.Enabled() {
		runtime.GOMAXPROCS(1)
	}
	return func() {
		runtime.GOMAXPROCS(procs)
		stopGC()
	}
}

// PerChange is d in microseconds per change (or row).
func PerChange(d time.Duration, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1000 / float64(n)
}

// Median of xs (the mean of the middle two for an even count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Metrics collects one value per run for each metric unit and reports the medians.
type Metrics struct {
	order []string
	runs  map[string][]float64
}

// Add records value for unit in the current run. Units follow the report's naming: a rate
// ("queue_changes/s"), a ratio ("queue_ratio") or a CPU cost "<phase>_cpu_<process>_us/change"
// (or "/row").
func (m *Metrics) Add(unit string, value float64) {
	if m.runs == nil {
		m.runs = map[string][]float64{}
	}
	if _, ok := m.runs[unit]; !ok {
		m.order = append(m.order, unit)
	}
	m.runs[unit] = append(m.runs[unit], value)
}

// Report logs every run's values and reports each unit's median to b.
func (m *Metrics) Report(b *testing.B) {
	for _, u := range m.order {
		vals := make([]string, len(m.runs[u]))
		for i, v := range m.runs[u] {
			vals[i] = strconv.FormatFloat(v, 'g', 4, 64)
		}
		b.Logf("%s: runs %s, median %.4g", u, strings.Join(vals, " "), Median(m.runs[u]))
		b.ReportMetric(Median(m.runs[u]), u)
	}
}

// PGClientBin finds a PostgreSQL client program (pg_recvlogical, pgbench): in the server's bin
// directory when it has one, else the newest in /usr/lib/postgresql/*/bin.
func PGClientBin(serverBin, name string) (string, error) {
	if p := filepath.Join(serverBin, name); fileExists(p) {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		c, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > c
	})
	for _, d := range dirs {
		if p := filepath.Join(d, name); fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found in %s or /usr/lib/postgresql/*/bin", name, serverBin)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// profiles counts the profiles written per name, so each run's window gets its own file.
var (
	profilesMu sync.Mutex
	profiles   = map[string]int{}
)

// Profile writes a CPU profile of this process to $PGRELAY_BENCH_PROFILE/<name>_<n>.pprof (n: 1
// for the first window of that name, then 2, ...) while the measured window runs, when that
// directory is set, and an execution trace to $PGRELAY_BENCH_TRACE/<name>_<n>.trace when that one
// is (go tool trace; `-pprof=sync` or `-pprof=sched` of it show where goroutines wait); the
// returned func ends them (the first call: later ones do nothing). Profiling costs a few per cent
// of CPU, tracing more: profile in a separate run from the one whose figures are reported. go tool
// pprof (and pprofgroup) add up several files.
func Profile(tb testing.TB, name string) func() {
	dir, traceDir := os.Getenv("PGRELAY_BENCH_PROFILE"), os.Getenv("PGRELAY_BENCH_TRACE")
	if dir == "" && traceDir == "" {
		return func() {}
	}
	profilesMu.Lock()
	profiles[name]++
	name = fmt.Sprintf("%s_%d", name, profiles[name])
	profilesMu.Unlock()
	var stops []func()
	for _, r := range []struct {
		dir, file, what string
		start           func(io.Writer) error
		stop            func()
	}{
		{dir, name + ".pprof", "CPU profile", pprof.StartCPUProfile, pprof.StopCPUProfile},
		{traceDir, name + ".trace", "trace", trace.Start, trace.Stop},
	} {
		if r.dir == "" {
			continue
		}
		f := create(tb, r.dir, r.file)
		if err := r.start(f); err != nil {
			f.Close()
			tb.Logf("benchenv: no %s for %s: %v", r.what, name, err)
			continue
		}
		stops = append(stops, func() { r.stop(); f.Close() })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, stop := range stops {
				stop()
			}
		})
	}
}

// create makes dir and the file name in it.
func create(tb testing.TB, dir, name string) *os.File {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		tb.Fatal(err)
	}
	return f
}
