package benchenv

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// burn uses at least d of this process' CPU time (getrusage), however loaded the machine is.
func burn(t *testing.T, d time.Duration) {
	start, deadline := SelfCPU(), time.Now().Add(60*time.Second)
	x := 0
	for SelfCPU()-start < d {
		for i := 0; i < 100000; i++ {
			x += i
		}
		if time.Now().After(deadline) {
			t.Fatal("no CPU time for a minute")
		}
	}
	_ = x
}

func TestCPUOfThisProcessGrowsWithWork(t *testing.T) {
	before, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	burn(t, 150*time.Millisecond)
	after, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts 10 ms ticks; the race detector's goroutines may add a little
	if got := after - before; got < 130*time.Millisecond {
		t.Fatalf("/proc CPU grew by %s while getrusage grew by 150 ms", got)
	}
	if _, err := CPU(1 << 30); err == nil {
		t.Fatal("CPU of a pid that does not exist: no error")
	}
}

// TreeCPU keeps the CPU of a child that has exited and been reaped (cutime), as a PostgreSQL
// backend's is kept by its postmaster.
func TestTreeCPUCountsReapedChildren(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// sh runs a child that uses 100 ms of CPU (this test binary, see TestMain) and waits for
	// it, then sleeps: the child is gone and sh holds its time
	cmd := exec.Command(sh, "-c", `"$0"; sleep 30; exit 0`, os.Args[0])
	cmd.Env = append(os.Environ(), "BENCHENV_BURN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if kids := testenv.Descendants(cmd.Process.Pid); len(kids) == 1 && isSleep(kids[0]) { // the busy child is gone
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the busy child did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	own, err := CPU(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := TreeCPU(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if tree-own < 90*time.Millisecond {
		t.Fatalf("TreeCPU %s, own %s: the reaped child's CPU is missing", tree, own)
	}
}

// TestMain makes this test binary the busy child of TestTreeCPUCountsReapedChildren when
// BENCHENV_BURN=1: it uses 100 ms of CPU and exits.
func TestMain(m *testing.M) {
	if os.Getenv("BENCHENV_BURN") == "1" {
		start := SelfCPU()
		for x := 0; SelfCPU()-start < 100*time.Millisecond; x++ {
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// isSleep reports whether pid runs sleep (not sh between fork and exec, nor the busy child).
func isSleep(pid int) bool {
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(comm)) == "sleep"
}

func TestMedianAndSize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	t.Setenv("PGRELAY_BENCH_QUICK", "1")
	t.Setenv("PGRELAY_BENCH_X", "")
	if got := Size("PGRELAY_BENCH_X", 100, 10); got != 10 {
		t.Errorf("quick Size = %d, want 10", got)
	}
	t.Setenv("PGRELAY_BENCH_X", "7")
	if got := Size("PGRELAY_BENCH_X", 100, 10); got != 7 {
		t.Errorf("Size with the variable set = %d, want 7", got)
	}
	if got := PerChange(3*time.Second, 1_000_000); got != 3 {
		t.Errorf("PerChange = %v, want 3 µs", got)
	}
}

// ReadWaits reads this process' threads and skips a process that is gone; a window's wait is
// never negative.
func TestReadWaits(t *testing.T) {
	self := os.Getpid()
	w := ReadWaits(self, 1<<30)
	if _, ok := w[self]; !ok {
		t.Fatalf("no wait read for this process: %v", w)
	}
	if _, ok := w[1<<30]; ok {
		t.Fatalf("a wait read for a process that does not exist: %v", w)
	}
	if d := w.Since(self); d < 0 {
		t.Fatalf("negative wait %v", d)
	}
}

// RedisCalls counts a command's calls from INFO commandstats: 0 before its first, then each one.
func TestRedisCalls(t *testing.T) {
	rdb := testenv.StartRedis(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	if n, err := RedisCalls(ctx, rdb, "echo"); n != 0 || err != nil {
		t.Fatalf("before any ECHO: %d, %v", n, err)
	}
	for range 3 {
		rdb.Echo(ctx, "x")
	}
	if n, err := RedisCalls(ctx, rdb, "echo"); n != 3 || err != nil {
		t.Fatalf("after 3 ECHOs: %d, %v", n, err)
	}
}

// Profile writes a CPU profile and an execution trace per window when their directories are set,
// numbered per name, and nothing when neither is.
func TestProfileWritesEachWindow(t *testing.T) {
	t.Setenv("PGRELAY_BENCH_PROFILE", "")
	t.Setenv("PGRELAY_BENCH_TRACE", "")
	Profile(t, "none")()
	prof, tr := t.TempDir(), t.TempDir()
	t.Setenv("PGRELAY_BENCH_PROFILE", prof)
	t.Setenv("PGRELAY_BENCH_TRACE", tr)
	for range 2 {
		stop := Profile(t, "window")
		burn(t, 20*time.Millisecond)
		stop()
		stop() // a second call does nothing
	}
	for _, f := range []string{prof + "/window_1.pprof", prof + "/window_2.pprof", tr + "/window_1.trace", tr + "/window_2.trace"} {
		st, err := os.Stat(f)
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: %v (size %d)", f, err, func() int64 {
				if st == nil {
					return -1
				}
				return st.Size()
			}())
		}
	}
	if _, err := os.Stat(prof + "/none_1.pprof"); err == nil {
		t.Error("a window was profiled with no directory set")
	}
}
