package source

import (
	"sync"
)

// itemQueue is the bounded hand-over between the WAL reader and the bundler. The reader stops
// reading the WAL while it holds 2× the bundle limits, so memory stays bounded whatever the
// transaction size; a change bigger than the limit still passes alone.
type itemQueue struct {
	mu       sync.Mutex
	items    []item
	events   int
	bytes    int
	maxEv    int
	maxBytes int
	changed  chan struct{} // closed and replaced on every push and pop
	full     chan struct{} // closed when a full bundle is queued (nil: nobody waits)
}

func newItemQueue(maxEvents, maxBytes int) *itemQueue {
	return &itemQueue{maxEv: 2 * maxEvents, maxBytes: 2 * maxBytes, changed: make(chan struct{})}
}

// holdsBundle reports whether a full bundle (maxEvents or maxBytes) is queued.
func (q *itemQueue) holdsBundle() bool { return q.events >= q.maxEv/2 || q.bytes >= q.maxBytes/2 }

// whenFull returns a channel closed once a full bundle is queued (already closed if one is). Unlike
// changed, it does not wake its waiter on every push.
func (q *itemQueue) whenFull() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.full == nil {
		q.full = make(chan struct{})
	}
	ch := q.full
	if q.holdsBundle() {
		close(q.full)
		q.full = nil
	}
	return ch
}

// tryPush appends it unless the queue is full; it returns the channel to wait on when full.
func (q *itemQueue) tryPush(it item) (bool, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 && (q.events+len(it.events) > q.maxEv || q.bytes+it.size > q.maxBytes) {
		return false, q.changed
	}
	q.items = append(q.items, it)
	q.events += len(it.events)
	q.bytes += it.size
	q.signal()
	if q.full != nil && q.holdsBundle() {
		close(q.full)
		q.full = nil
	}
	return true, nil
}

// snapshot returns the queued items without removing them, plus the channel signalling a change.
func (q *itemQueue) snapshot() ([]item, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.items, q.changed
}

// pop removes the first n items.
func (q *itemQueue) pop(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range q.items[:n] {
		q.events -= len(it.events)
		q.bytes -= it.size
	}
	rest := make([]item, len(q.items)-n, cap(q.items))
	copy(rest, q.items[n:])
	q.items = rest
	q.signal()
}

func (q *itemQueue) signal() {
	close(q.changed)
	q.changed = make(chan struct{})
}
