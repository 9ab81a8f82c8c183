package source

import (
	"context"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/pointer"
)

// An idle bundler must sleep: bundle on an empty queue (or one whose items the pointer already
// covers) returns a channel that stays open until something is pushed. A pop of nothing used to
// signal a change, so the bundler woke at once and looped, burning a core while idle.
func TestBundleOnIdleQueueWaits(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100)
	for _, c := range []struct {
		name  string
		items []item
	}{
		{"empty queue", nil},
		{"a position the pointer covers", []item{positionItem(50)}},
	} {
		ss := testSession(10, start, c.items...)
		for i := 0; i < 3; i++ { // the first call may pop covered items; then it must settle
			b, wait, err := ss.bundle(context.Background())
			if err != nil || b != nil {
				t.Fatalf("%s: batch %v, err %v", c.name, b, err)
			}
			if i < 2 {
				continue
			}
			select {
			case <-wait.ch:
				t.Fatalf("%s: the wait channel is already closed: the bundler would spin", c.name)
			case <-time.After(20 * time.Millisecond):
			}
			if ok, _ := ss.q.tryPush(change(200, 0, 1)); !ok {
				t.Fatal("push refused")
			}
			select {
			case <-wait.ch:
			case <-time.After(time.Second):
				t.Fatalf("%s: a push did not wake the bundler", c.name)
			}
		}
	}
}

func TestItemQueuePop(t *testing.T) {
	q := newItemQueue(1000, 1<<20)
	for i := 0; i < 5; i++ {
		q.tryPush(change(100, uint64(i), 2))
	}
	_, before := q.peek()
	q.pop(0)
	select {
	case <-before:
		t.Fatal("pop(0) signalled a change")
	default:
	}
	q.pop(2)
	items, _ := q.peek()
	if len(items) != 3 || items[0].seq != 2 || items[2].seq != 4 || q.events != 6 {
		t.Fatalf("after pop(2): %d items (first seq %d), %d events", len(items), items[0].seq, q.events)
	}
	select {
	case <-before:
	default:
		t.Fatal("pop(2) did not signal")
	}
	q.pop(3)
	if items, _ := q.peek(); len(items) != 0 || q.events != 0 || q.bytes != 0 {
		t.Fatalf("after popping all: %d items, %d events, %d bytes", len(items), q.events, q.bytes)
	}
}

// A pop must not copy the queue: it used to allocate and clear a slice of the queue's whole
// capacity on every pop, a third of the process' CPU at 2,000 transactions a second.
func TestItemQueuePopDoesNotCopy(t *testing.T) {
	q := newItemQueue(100000, 1<<30)
	for i := 0; i < 50000; i++ {
		q.tryPush(positionItem(0))
	}
	q.pop(50000) // a long queue once: its capacity stays large
	it := change(100, 0, 1)
	allocs := testing.AllocsPerRun(1000, func() {
		q.tryPush(it)
		q.pop(1)
	})
	if allocs > 2 { // the new channels of the push's and the pop's signals
		t.Fatalf("push+pop allocates %.1f times", allocs)
	}
}
