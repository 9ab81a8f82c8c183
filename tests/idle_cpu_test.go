package tests

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuTime is the user+system CPU time a process has used so far, from /proc/<pid>/stat.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// the command name (field 2) may hold spaces: the fields after it start past the last ')'
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of the line
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

// An idle pipeline sleeps: once a source has caught up and a sink has applied everything, neither
// process uses more than a sliver of a core while nothing changes. (pg_cdc's bundler once woke
// itself on an empty queue and spun, a whole core for as long as the source was idle.)
func TestIdlePipelinesSleep(t *testing.T) {
	rt := newRoundTrip(t, "idle")
	dsnB := rt.database("b")
	sink := startSinkPipeline(t, rt.sinkConfig(dsnB, "copy_b", "copy_b"))
	rt.pg.Exec(`INSERT INTO rt (id, doc) SELECT g, '{}' FROM generate_series(1, 100) g`)
	rt.waitCaughtUp("b", "copy_b", sink, 60*time.Second)
	time.Sleep(2 * time.Second) // let start-up work settle
	source := rt.source
	const window = 4 * time.Second
	s0, k0 := cpuTime(t, source.Pid()), cpuTime(t, sink.Pid())
	time.Sleep(window)
	s1, k1 := cpuTime(t, source.Pid()), cpuTime(t, sink.Pid())
	t.Logf("CPU over %s idle: source %s, sink %s", window, s1-s0, k1-k0)
	for name, used := range map[string]time.Duration{"source": s1 - s0, "sink": k1 - k0} {
		if used > window/10 {
			t.Errorf("the idle %s used %s of CPU in %s (more than 10 %% of a core)", name, used, window)
		}
	}
}
