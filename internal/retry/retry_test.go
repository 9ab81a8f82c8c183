package retry

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	for _, c := range []struct {
		name   string
		cancel bool
		d      time.Duration
		whole  bool
	}{
		{"the whole wait", false, 20 * time.Millisecond, true},
		{"cut short by the context", true, time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancel {
				go func() { time.Sleep(10 * time.Millisecond); cancel() }()
			}
			t0 := time.Now()
			if got := Sleep(ctx, c.d); got != c.whole {
				t.Errorf("Sleep = %v, want %v", got, c.whole)
			}
			if c.whole && time.Since(t0) < c.d {
				t.Errorf("returned after %s, before %s", time.Since(t0), c.d)
			}
		})
	}
}

func TestJitter(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, time.Second, 10 * time.Second} {
		for i := 0; i < 1000; i++ {
			if j := Jitter(d); j < d*8/10 || j > d*12/10 {
				t.Fatalf("Jitter(%s) = %s, outside 80-120 %%", d, j)
			}
		}
	}
}
