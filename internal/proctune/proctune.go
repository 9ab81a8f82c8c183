// Package proctune sets how many Go processors (GOMAXPROCS) pgrelay's process runs with: one
// while its work fits in a core, Go's default once it needs more.
//
// A pipeline's stages mostly follow each other batch by batch. With two or more processors, nearly
// every hand-over between goroutines (the WAL reader, Benthos' input, pipeline and output loops, a
// Redis reply, an acknowledgement) finds a processor idle and wakes a thread for it, which then
// finds nothing to steal: on a 2-core host those wake-ups were a tenth to a fifth of pgrelay's CPU
// per change, at the same rates (docs/operations.md, Capacity planning). One processor runs a
// hand-over on the thread that made it. It also caps the process at about a core, so the tuner
// reads the process's CPU time every Interval and gives Go's default back (a processor per core,
// or the container's CPU limit) once pgrelay used most of a core for a few intervals in a row,
// and takes it away again after a long spell well under one.
//
// Setting GOMAXPROCS in the environment leaves the processors to Go (Enabled reports it).
package proctune

import (
	"os"
	"runtime"
	"sync"
	"time"
)

const (
	// Interval is how often the tuner reads the process's CPU time.
	Interval = time.Second
	// RaiseAt and RaiseAfter: Go's default once the process used at least RaiseAt cores in each of
	// RaiseAfter intervals in a row. One processor gives it about one core at most, and a pipeline
	// whose stages overlap (a snapshot with its chunks read ahead and two batches in flight) was
	// seen at 0.6–0.8 of it on one processor while it ran a little faster on two.
	RaiseAt    = 0.75
	RaiseAfter = 3
	// LowerAt and LowerAfter: one processor again after LowerAfter intervals in a row at or below
	// LowerAt cores.
	LowerAt    = 0.5
	LowerAfter = 30
)

// Enabled reports whether the environment leaves the processors to pgrelay (GOMAXPROCS unset).
func Enabled() bool { return os.Getenv("GOMAXPROCS") == "" }

// Controller decides, one interval at a time, whether the process runs on one processor.
type Controller struct {
	One       bool // on one processor (else Go's default)
	high, low int  // intervals in a row at or above RaiseAt, at or below LowerAt
}

// Step records the cores the process used over the last interval and reports whether the
// setting changes (One holds the new one).
func (c *Controller) Step(cores float64) bool {
	if c.One {
		if cores < RaiseAt {
			c.high = 0
			return false
		}
		if c.high++; c.high < RaiseAfter {
			return false
		}
	} else {
		if cores > LowerAt {
			c.low = 0
			return false
		}
		if c.low++; c.low < LowerAfter {
			return false
		}
	}
	c.One, c.high, c.low = !c.One, 0, 0
	return true
}

var (
	mu      sync.Mutex
	running bool
)

// Start runs the tuner until stop is called (stop gives Go's default back): one processor at
// once, when Go's default gives the process more than one and the process's CPU time can be read.
// One tuner runs per process; a second Start while one runs returns a stop that does nothing.
func Start() (stop func()) {
	mu.Lock()
	defer mu.Unlock()
	if running || runtime.GOMAXPROCS(0) < 2 {
		return func() {}
	}
	if _, ok := ProcessCPU(); !ok {
		return func() {}
	}
	running = true
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(Interval)
		defer tick.Stop()
		run(ProcessCPU, apply, tick.C, done)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
			runtime.SetDefaultGOMAXPROCS()
			mu.Lock()
			running = false
			mu.Unlock()
		})
	}
}

// apply sets one processor, or Go's default.
func apply(one bool) {
	if one {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.SetDefaultGOMAXPROCS()
	}
}

// run is the tuner's loop: one processor first, then a Controller step on each tick with the
// cores used since the previous one, until done.
func run(cpu func() (time.Duration, bool), set func(one bool), tick <-chan time.Time, done <-chan struct{}) {
	c := Controller{One: true}
	last, _ := cpu()
	at := time.Now()
	set(true)
	for {
		select {
		case <-done:
			return
		case now := <-tick:
			used, ok := cpu()
			if !ok {
				continue
			}
			if wall := now.Sub(at); wall > 0 && c.Step((used-last).Seconds()/wall.Seconds()) {
				set(c.One)
			}
			last, at = used, now
		}
	}
}
