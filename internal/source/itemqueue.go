package source

import (
	"encoding/json"
	"sync"

	"github.com/jackc/pglogrepl"
)

// itemKind is what an item carries.
type itemKind uint8

const (
	itemChange   itemKind = iota // one raw change: zero (unmapped, skipped truncate), one or two events
	itemCommit                   // the end of the transaction committing at commit
	itemPosition                 // an idle advance: every commit ≤ lsn is in
	// itemChunk is one part of a snapshot chunk: its events go in at the high watermark (commit),
	// and the cover takes its cursor (chunk).
	itemChunk
)

// item is the unit the WAL reader (and the snapshotter, through it) hands to the bundler.
type item struct {
	kind   itemKind
	behind bool // itemCommit: the transaction arrived with the stream behind the writers (lagMeter)
	commit pglogrepl.LSN
	seq    uint64
	events []Event
	size   int
	lsn    pglogrepl.LSN
	chunk  *chunkPart // itemChunk: the snapshot cursor after this part
	// parts: envelope parts of the transaction in the queue once this item is, by queue (set
	// on an item that closes parts before the transaction's commit)
	parts map[string]uint64
}

// chunkPart is the pointer's snapshot field after one part of a chunk is in the queue.
type chunkPart struct {
	cursor json.RawMessage // the Cursor JSON, or null after the last table
	rows   int             // rows this part moves the cursor by (for metrics and the log)
	next   string          // the table the cursor points at afterwards ("" when done)
}

// itemQueue is the bounded hand-over between the WAL reader and the bundler. The reader stops
// reading the WAL while it holds 2× the bundle limits, so memory stays bounded whatever the
// transaction size; a change bigger than the limit still passes alone.
type itemQueue struct {
	mu       sync.Mutex
	items    []item // the live items are items[head:]
	head     int
	events   int
	bytes    int
	maxEv    int
	maxBytes int
	changed  chan struct{} // closed on every push and pop; made only when someone waits (nil: nobody does)
	full     chan struct{} // closed when a full bundle is queued (nil: nobody waits)
}

func newItemQueue(maxEvents, maxBytes int) *itemQueue {
	return &itemQueue{maxEv: 2 * maxEvents, maxBytes: 2 * maxBytes}
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
	if len(q.items) > q.head && (q.events+len(it.events) > q.maxEv || q.bytes+it.size > q.maxBytes) {
		return false, q.waitChanged()
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

// peek returns the queued items without removing them, plus the channel signalling a change.
// Only the bundler may call it (the items stay valid until its own next pop).
func (q *itemQueue) peek() ([]item, <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.items[q.head:], q.waitChanged()
}

// pop removes the first n items.
//
// It moves a head index instead of copying the queue: a copy the size of the queue's capacity on
// every pop cost a third of the process' CPU at 2,000 small transactions a second. The live items
// are moved to the front only when the head passes half the array, and popped items are cleared
// so their events can be freed. Only the bundler pops, after it is done with its snapshot.
func (q *itemQueue) pop(n int) {
	if n == 0 {
		return // no change: a signal would wake the bundler, which would pop nothing again (a spin)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	live := q.items[q.head:]
	for _, it := range live[:n] {
		q.events -= len(it.events)
		q.bytes -= it.size
	}
	clear(live[:n])
	q.head += n
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head > cap(q.items)/2:
		m := copy(q.items, q.items[q.head:])
		clear(q.items[m:])
		q.items, q.head = q.items[:m], 0
	}
	q.signal()
}

// signal wakes whoever waits for a change. The channel is made by the first waiter after the last
// signal, not on every push: most pushes have nobody waiting, and a channel each cost an allocation
// per change.
func (q *itemQueue) signal() {
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
}

// waitChanged returns the channel the next signal closes (under q.mu).
func (q *itemQueue) waitChanged() <-chan struct{} {
	if q.changed == nil {
		q.changed = make(chan struct{})
	}
	return q.changed
}
