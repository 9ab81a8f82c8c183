package source

import (
	"errors"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/queue"
)

// TestRetryThatFailsAgainStaysFirst: two batches in flight both fail (the second refused
// behind the first); the first re-send fails again. The next re-send must be the first batch
// again, not the second alone (which, sent with no Prev, would move the pointer past the first
// batch's changes: they would be lost).
func TestRetryThatFailsAgainStaysFirst(t *testing.T) {
	s, _, b1, b2 := twoInFlight(t)
	delivered(t, s, b1, errors.New("redis went away"))
	delivered(t, s, b2, queue.ErrBehind)
	r1, _ := nextWithin(t, s, 5*time.Second)
	if r1 != b1 {
		t.Fatalf("first re-send %+v, want the first batch", r1)
	}
	delivered(t, s, r1, errors.New("redis went away again"))
	r2, _ := nextWithin(t, s, 5*time.Second)
	if r2 != b1 {
		t.Fatalf("after the first batch's re-send failed, the next batch handed out is %s (Prev %q), want the first batch %s again",
			r2.pos(), r2.Prev, b1.pos())
	}
}

// slowErr is a write error whose inspection takes a while (Unwrap sleeps): it stands for the
// goroutine that runs Ack being descheduled between the moment Ack took the batch off the list in
// flight and the moment settle queued it for its re-send.
type slowErr struct{ d time.Duration }

func (e slowErr) Error() string { return "redis went away (slowly)" }
func (e slowErr) Unwrap() error { time.Sleep(e.d); return nil }

// TestNackedBatchGoesAgainBeforeTheOneBuiltAhead: with one batch in flight and the next built ahead, a
// Next waiting for its turn must hand out the nacked batch again, not the one built ahead (with no
// Prev, it would move the pointer past the nacked batch: its changes lost). Ack wakes the waiting
// Next (outCh) before settle queued the nacked batch for its re-send.
func TestNackedBatchGoesAgainBeforeTheOneBuiltAhead(t *testing.T) {
	for _, window := range []int{1, 2} {
		s, _ := windowSource(t, 2, threeTransactions()...)
		s.chain.Offer(window)
		b1, _ := nextWithin(t, s, time.Second)
		if b1 == nil {
			t.Fatal("no first batch")
		}
		var wait <-chan *Batch
		if window == 2 {
			b2, _ := nextWithin(t, s, time.Second)
			delivered(t, s, b2, queue.ErrBehind) // resolved, settled only after b1
		}
		_, wait = nextWithin(t, s, 200*time.Millisecond) // waits for its turn, builds the next batch ahead
		done := make(chan struct{})
		go func() { delivered(t, s, b1, slowErr{300 * time.Millisecond}); close(done) }()
		got := <-wait
		<-done
		if got != b1 {
			t.Fatalf("window %d: after the nack of %s, Next handed out %s (Prev %q): the nacked batch was skipped",
				window, b1.pos(), got.pos(), got.Prev)
		}
	}
}

// TestConcurrentAcksKeepRetryOrder: both batches in flight fail and their acks run at once
// (Benthos acks asynchronously): the first batch must be sent again first.
func TestConcurrentAcksKeepRetryOrder(t *testing.T) {
	s, _, b1, b2 := twoInFlight(t)
	done := make(chan struct{})
	go func() { delivered(t, s, b1, slowErr{300 * time.Millisecond}); close(done) }()
	time.Sleep(50 * time.Millisecond) // b1 taken off the list, its settle under way
	delivered(t, s, b2, queue.ErrBehind)
	<-done
	r, _ := nextWithin(t, s, 5*time.Second)
	if r != b1 {
		t.Fatalf("first re-send is %s (Prev %q), want the first batch %s", r.pos(), r.Prev, b1.pos())
	}
}
