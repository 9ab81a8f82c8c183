package proctune

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestControllerSteps(t *testing.T) {
	repeat := func(v float64, n int) []float64 { return slices.Repeat([]float64{v}, n) }
	for _, c := range []struct {
		name  string
		one   bool
		cores []float64
		want  []int // the steps (0-based) that switch
	}{
		{"one processor, below a core", true, repeat(0.6, 50), nil},
		{"one processor, a whole core for RaiseAfter intervals", true, repeat(0.95, RaiseAfter), []int{RaiseAfter - 1}},
		{"one processor, a whole core with a dip", true, append(append(repeat(0.95, RaiseAfter-1), 0.7), repeat(0.95, RaiseAfter-1)...), nil},
		{"the default, busy", false, repeat(1.4, 100), nil},
		{"the default, between the thresholds", false, repeat(0.7, 100), nil},
		{"the default, idle for LowerAfter intervals", false, repeat(0.2, LowerAfter), []int{LowerAfter - 1}},
		{"the default, idle with a burst", false, append(append(repeat(0.2, LowerAfter-1), 0.8), repeat(0.2, LowerAfter-1)...), nil},
		{"up and down again", true, append(repeat(1.0, RaiseAfter), repeat(0.1, LowerAfter)...), []int{RaiseAfter - 1, RaiseAfter + LowerAfter - 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl := Controller{One: c.one}
			var got []int
			for i, v := range c.cores {
				if ctl.Step(v) {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("switched at steps %v, want %v", got, c.want)
			}
		})
	}
}

// TestRunFollowsTheProcessCPU: the loop sets one processor at once, gives the default back after
// RaiseAfter ticks at a whole core (the CPU time over the ticks' own times), and one processor
// again after LowerAfter idle ticks.
func TestRunFollowsTheProcessCPU(t *testing.T) {
	tick := make(chan time.Time)
	done := make(chan struct{})
	reads := make(chan time.Duration) // the CPU time each read of the loop returns
	cpu := func() (time.Duration, bool) { return <-reads, true }
	sets := make(chan bool, 10)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		run(cpu, func(one bool) { sets <- one }, tick, done)
	}()
	now := time.Now()
	reads <- 0
	if one := <-sets; !one {
		t.Fatal("the tuner did not start on one processor")
	}
	var used time.Duration
	step := func(cores float64) {
		now = now.Add(2 * time.Second)
		used += time.Duration(cores * float64(2*time.Second))
		tick <- now
		reads <- used
	}
	for range RaiseAfter {
		step(0.95)
	}
	if one := <-sets; one {
		t.Fatal("a whole core used for RaiseAfter intervals did not give the default back")
	}
	for range LowerAfter {
		step(0.1)
	}
	if one := <-sets; !one {
		t.Fatal("LowerAfter idle intervals did not set one processor again")
	}
	close(done)
	<-finished
	if len(sets) != 0 {
		t.Errorf("%d more switches than expected", len(sets))
	}
}

// TestStartSetsOneProcessor: Start puts the process on one processor, a second Start while it
// runs does nothing, and stop (once) gives Go's default back.
func TestStartSetsOneProcessor(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	runtime.SetDefaultGOMAXPROCS()
	want := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(2) // Start does nothing on one processor
	stop := Start()
	defer stop()
	waitProcs(t, 1)
	runtime.GOMAXPROCS(3)
	Start()()
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Errorf("a second Start (and its stop) changed GOMAXPROCS to %d", n)
	}
	stop()
	if n := runtime.GOMAXPROCS(0); n != want {
		t.Errorf("GOMAXPROCS %d after stop, want Go's default %d", n, want)
	}
	runtime.GOMAXPROCS(3)
	stop()
	if n := runtime.GOMAXPROCS(0); n != 3 {
		t.Errorf("a second stop changed GOMAXPROCS to %d", n)
	}
}

// waitProcs waits until GOMAXPROCS is n (the tuner sets it from its own goroutine).
func waitProcs(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.GOMAXPROCS(0) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS %d, want %d", runtime.GOMAXPROCS(0), n)
		}
	}
}
