package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		name           string
		live, headroom uint64
		want           int
	}{
		{"small heap: the headroom over the live heap", 8 << 20, 64 << 20, 800},
		{"nearly empty heap: the floor of 4 MiB", 100 << 10, 64 << 20, 1600},
		{"empty heap", 0, 64 << 20, 1600},
		{"live heap as large as the headroom: Go's default", 64 << 20, 64 << 20, 100},
		{"larger live heap: never below Go's default", 1 << 30, 64 << 20, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Percent(c.live, c.headroom); got != c.want {
				t.Fatalf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
			}
		})
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestStartFollowsTheLiveHeap: the goal is set at start and again after collections as the live
// heap changes, and stop restores the GOGC in force before.
func TestStartFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := Start(64 << 20)
	if got := gogc(); got < 800 {
		t.Fatalf("GOGC after Start = %d, want the headroom over a small live heap (>= 800)", got)
	}
	if again := Start(1 << 20); gogc() < 800 {
		t.Fatal("a second Start changed the goal")
	} else {
		again()
	}
	// a live heap of 96 MiB, more than the headroom: Go's default after the next collections
	held := make([][]byte, 96)
	for i := range held {
		held[i] = make([]byte, 1<<20)
		held[i][0] = 1
	}
	deadline := time.Now().Add(30 * time.Second)
	for gogc() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC = %d with a live heap of 96 MiB, want 100", gogc())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(held)
	held = nil
	for gogc() < 800 {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC = %d once the live heap shrank, want >= 800", gogc())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if got := gogc(); got != 100 {
		t.Fatalf("GOGC after stop = %d, want 100 (the value before Start)", got)
	}
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	if got := gogc(); got != 100 {
		t.Fatalf("GOGC after stop and a collection = %d, want 100", got)
	}
}
