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
}

func newItemQueue(maxEvents, maxBytes int) *itemQueue {
	return &itemQueue{maxEv: 2 * maxEvents, maxBytes: 2 * maxBytes, changed: make(chan struct{})}
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
	return true, nil
}

// peek returns the first n items without removing them, plus the channel signalling a change.
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
