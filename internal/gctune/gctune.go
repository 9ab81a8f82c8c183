// Package gctune sets the garbage collector's goal of pgrelay's process: the heap may grow a fixed
// headroom above the live heap before the next collection, instead of Go's default of doubling it.
//
// pgrelay's live heap is small (a few MiB: the batches in flight, the caches) while it allocates
// several KiB per change, so with the default GOGC=100 it collects every few thousand changes and
// the collector's marking and sweeping is the largest single cost of a streamed change. A goal of
// live + Headroom makes collections several times rarer while the heap stays bounded by
// the live heap plus a constant; once the live heap outgrows the headroom the goal is Go's own
// (twice the live heap), so a large live heap never makes the collector run more often than the
// default.
//
// The goal is recomputed after every collection from the live heap it measured. Setting GOGC or
// GOMEMLIMIT in the environment leaves the collector to Go (Enabled reports it).
package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Headroom is how far above the live heap the heap may grow between collections: 32 MiB makes a
// streaming pg_cdc collect about 7 times less often than at GOGC=100 (6 MiB live), while the heap's
// sawtooth and the process' resident set grow by no more than that.
const Headroom = 32 << 20

// minLive is the smallest live heap Percent assumes. Go scales its own floor of the goal (4 MiB at
// GOGC=100) by GOGC, so with this floor a nearly empty heap (right after start) gets a goal of
// about headroom, not a multiple of it.
const minLive = 4 << 20

// Percent is the GOGC that puts the next collection headroom bytes above a live heap of live
// bytes, never below Go's default of 100.
func Percent(live, headroom uint64) int {
	p := headroom * 100 / max(live, minLive)
	if p < 100 {
		return 100
	}
	return int(p)
}

// Enabled reports whether the environment leaves the collector's goal to pgrelay (neither GOGC
// nor GOMEMLIMIT is set).
func Enabled() bool {
	return os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == ""
}

var (
	mu      sync.Mutex
	running *tuner
)

// Start keeps the collector's goal at the live heap plus headroom until stop is called (stop
// restores the GOGC in force before). Only one tuner runs per process; a second Start while one
// runs returns a stop that does nothing.
func Start(headroom uint64) (stop func()) {
	mu.Lock()
	defer mu.Unlock()
	if running != nil {
		return func() {}
	}
	t := &tuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	running = t
	t.before = debug.SetGCPercent(100)
	t.adjust()
	t.arm()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if t.stopped.Swap(true) {
			return
		}
		debug.SetGCPercent(t.before)
		running = nil
	}
}

type tuner struct {
	headroom uint64
	before   int
	stopped  atomic.Bool
	sample   []metrics.Sample // guarded by mu
}

// sentinel is garbage the collector finds at each cycle; its finalizer runs after the cycle.
// It is larger than 16 bytes so that it is not a tiny allocation (whose finalizers may never run).
type sentinel struct{ _ [32]byte }

func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		mu.Lock()
		defer mu.Unlock()
		if t.stopped.Load() {
			return
		}
		t.adjust()
		t.arm()
	})
}

func (t *tuner) adjust() {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	debug.SetGCPercent(Percent(t.sample[0].Value.Uint64(), t.headroom))
}
