package source

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
)

// windowSource is a source whose session streams items, bundles of maxMsgs events, with nothing
// behind it: batches are taken with Next and acknowledged with Ack as the input does.
func windowSource(t *testing.T, maxMsgs int, items ...item) (*Source, *session) {
	start := pointer.New(1, "e", "s", "x", 100)
	ss := testSession(maxMsgs, start)
	ss.q = newItemQueue(3, 1<<20) // whenFull fires with 3 events queued: more than a bundle
	for _, it := range items {
		if ok, _ := ss.q.tryPush(it); !ok {
			t.Fatal("queue full")
		}
	}
	s := ss.src
	s.log, s.chain, s.outCh, s.sessCh = testLogger{t}, queue.NewChain(), make(chan struct{}), make(chan struct{})
	s.keys.Pointer = "ptr"
	s.sess = ss
	return s, ss
}

// threeTransactions is three transactions of two changes each, each a full bundle of 2.
func threeTransactions() []item {
	return []item{change(200, 0, 1), change(200, 1, 1), commitItem(200), change(300, 0, 1), change(300, 1, 1), commitItem(300),
		change(400, 0, 1), change(400, 1, 1), commitItem(400), positionItem(401)}
}

// nextWithin returns the batch Next hands out within d, or nil when it keeps waiting (the call
// goes on in the background: its batch comes from the returned channel).
func nextWithin(t *testing.T, s *Source, d time.Duration) (*Batch, <-chan *Batch) {
	t.Helper()
	out := make(chan *Batch, 1)
	go func() {
		b, err := s.Next(context.Background(), nil)
		if err != nil {
			t.Errorf("Next: %v", err)
		}
		out <- b
	}()
	select {
	case b := <-out:
		return b, nil
	case <-time.After(d):
		return nil, out
	}
}

// delivered acknowledges b as redis_queue does: its cover is the stored pointer.
func delivered(t *testing.T, s *Source, b *Batch, err error) {
	t.Helper()
	if err == nil {
		b.Receipt().Mark(b.Cover.Position())
	}
	if aerr := s.Ack(context.Background(), b, err); aerr != nil {
		t.Fatal(aerr)
	}
}

// twoInFlight is a windowSource of threeTransactions whose output offered a window of two, with
// the first two batches taken: both go at once.
func twoInFlight(t *testing.T) (*Source, *session, *Batch, *Batch) {
	t.Helper()
	s, ss := windowSource(t, 2, threeTransactions()...)
	s.chain.Offer(2)
	b1, _ := nextWithin(t, s, time.Second)
	b2, _ := nextWithin(t, s, time.Second)
	if b1 == nil || b2 == nil {
		t.Fatal("two batches did not go at once")
	}
	return s, ss, b1, b2
}

// TestWindowOfOne: until the output offers more, the next batch goes only after the ack of the
// one in flight, though it is built (full) meanwhile.
func TestWindowOfOne(t *testing.T) {
	s, ss := windowSource(t, 2, threeTransactions()...)
	b1, _ := nextWithin(t, s, time.Second)
	if b1 == nil || b1.Prev != "" {
		t.Fatalf("first batch %+v", b1)
	}
	b2, wait := nextWithin(t, s, 200*time.Millisecond)
	if b2 != nil {
		t.Fatal("a second batch went before the first was acknowledged")
	}
	delivered(t, s, b1, nil)
	b2 = <-wait
	if b2 == nil || b2.Prev != "" || ss.flush.Load() != uint64(b1.Cover.LSNValue()) {
		t.Fatalf("second batch %+v, flush %d", b2, ss.flush.Load())
	}
}

// TestWindowOfTwo: with a window of two the full batch built ahead goes at once, behind the one in
// flight (Prev), and a third waits; verdicts are settled in the order the batches went, so an ack
// of the second first tells PostgreSQL nothing until the first's ack.
func TestWindowOfTwo(t *testing.T) {
	s, ss, b1, b2 := twoInFlight(t)
	if b1.Prev != "" || b2.Prev != b1.Cover.Position() || !b1.expected || !b2.expected {
		t.Fatalf("prev %q / %q, want \"\" / %q", b1.Prev, b2.Prev, b1.Cover.Position())
	}
	if sb := b2.ForQueue(false); sb.Cover.Prev != b1.Cover.Position() || sb.Cover.Chain != s.chain {
		t.Fatalf("the second batch's cover does not follow the first: %+v", sb.Cover)
	}
	b3, wait := nextWithin(t, s, 200*time.Millisecond)
	if b3 != nil {
		t.Fatal("a third batch went with two in flight")
	}
	delivered(t, s, b2, nil)
	if got := ss.flush.Load(); got != 0 {
		t.Fatalf("flush %d after the second batch's ack alone", got)
	}
	delivered(t, s, b1, nil)
	if got := ss.flush.Load(); got != uint64(b2.Cover.LSNValue()) {
		t.Fatalf("flush %d, want the second batch's %d", got, b2.Cover.LSNValue())
	}
	b3 = <-wait
	if b3 == nil || b3.Prev != b2.Cover.Position() && b3.Prev != "" {
		t.Fatalf("third batch %+v", b3)
	}
}

// TestWindowNackSendsBothAgainInOrder: when the first of two batches in flight fails, the second
// (refused by the writer: queue.ErrBehind) is not sent again before it; both go again one at a
// time, in order, and no new batch goes meanwhile.
func TestWindowNackSendsBothAgainInOrder(t *testing.T) {
	s, ss, b1, b2 := twoInFlight(t)
	delivered(t, s, b2, queue.ErrBehind)
	delivered(t, s, b1, errors.New("redis went away"))
	r1, _ := nextWithin(t, s, 5*time.Second)
	if r1 != b1 || r1.Prev != "" {
		t.Fatalf("first re-send %+v, want the first batch alone", r1)
	}
	r2, wait := nextWithin(t, s, 300*time.Millisecond)
	if r2 != nil {
		t.Fatal("a batch went beside the first re-send")
	}
	delivered(t, s, r1, nil)
	r2 = <-wait
	if r2 != b2 || r2.Prev != "" {
		t.Fatalf("second re-send %+v, want the second batch alone", r2)
	}
	delivered(t, s, r2, nil)
	if got := ss.flush.Load(); got != uint64(b2.Cover.LSNValue()) {
		t.Fatalf("flush %d, want %d", got, b2.Cover.LSNValue())
	}
	b3, _ := nextWithin(t, s, 5*time.Second)
	if b3 == nil || b3.Cover.LSNValue() <= b2.Cover.LSNValue() {
		t.Fatalf("the batch after the re-sends: %+v", b3)
	}
}
