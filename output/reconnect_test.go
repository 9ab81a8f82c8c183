package output

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// TestPaceDelay: a down output's reconnects wait 100 ms, doubling, at most 5 s; a write that
// reaches the server starts the next outage from 100 ms again.
func TestPaceDelay(t *testing.T) {
	for _, c := range []struct {
		n    int32
		want time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{5, 3200 * time.Millisecond},
		{6, 5 * time.Second},
		{40, 5 * time.Second},
	} {
		if got := paceDelay(c.n); got != c.want {
			t.Errorf("paceDelay(%d) = %s, want %s", c.n, got, c.want)
		}
	}
	var r reconnect
	r.tries.Store(4)
	r.wrote()
	if r.tries.Load() != 0 {
		t.Errorf("after a write the count is %d, want 0", r.tries.Load())
	}
}

// TestReconnectPacesAFailingLoop: Benthos calls Connect as soon as a write reports not connected
// and writes again as soon as Connect returns. Against a server that answers the ping while every
// write fails, the loop must not spin: over 1 s it connects 4 times (at once, then after 0.1, 0.3 and
// 0.7 s; the next would be at 1.5), where without the pauses it would connect as often as the calls can run. A write that gets through starts the
// next outage from the shortest pause; a Connect whose context ends returns at once.
func TestReconnectPacesAFailingLoop(t *testing.T) {
	var r reconnect
	answers := func(context.Context) error { return nil }
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	connects := 0
	for {
		if err := r.await(ctx, answers); err != nil {
			break
		}
		connects++
		if err := r.lost(nil, errors.New("write: connection refused")); !errors.Is(err, service.ErrNotConnected) {
			t.Fatalf("lost returned %v, want service.ErrNotConnected", err)
		}
	}
	if connects < 1 || connects > 4 {
		t.Fatalf("%d connects in 1 s against failing writes, want at most 4 (paced 100 ms, doubling)", connects)
	}

	r.wrote()
	r.lost(nil, errors.New("write: connection refused"))
	start := time.Now()
	if err := r.await(context.Background(), answers); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > time.Second {
		t.Fatalf("the first reconnect after a write waited %s, want about 100 ms", d)
	}
	if err := r.await(context.Background(), answers); err != nil || time.Since(start) > time.Second {
		t.Fatalf("an output that is not down waited or failed: %v", err)
	}

	r.lost(nil, errors.New("write: connection refused"))
	stop, cancelStop := context.WithCancel(context.Background())
	cancelStop()
	start = time.Now()
	if err := r.await(stop, answers); !errors.Is(err, context.Canceled) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("a stopped Connect returned %v after %s, want context.Canceled at once", err, time.Since(start))
	}
}
