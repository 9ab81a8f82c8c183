package source

// The snapshot's share of the pipeline. A chunk's rows enter the item queue where the WAL reader
// meets its high watermark, so the snapshot cannot overtake the stream; it can only decide when
// to read the next chunk. The rule:
//
//   - While the stream keeps up, however busy, the next chunk is read as soon as the bundler took
//     the previous one's parts: reading it overlaps with writing the previous one, and no chunk
//     waits for a quiet moment of the stream.
//   - While the stream is behind (a full bundle of stream changes waits in the item queue, as when
//     it catches up with a backlog), up to chunksInFlight chunks may be read before the reader
//     reaches their watermarks, so the stream finds a few chunks waiting behind its backlog
//     instead of one; and the next chunk goes only once the stream moved at least as many bytes as
//     the last chunk had since the previous chunk started: a weighted round robin, one to one, so
//     the stream and the snapshot each keep at least half of what the pipeline moves.
//   - Chunks read and not yet in the item queue hold at most chunkBytesInFlight bytes of values
//     (the first always goes).
//
// No clock takes part: the share is counted in bytes, so it holds however slow or loaded the
// machine is.
const (
	chunksInFlight     = 4
	chunkBytesInFlight = 32 << 20
)

// share is the rule's state; the snapshotter holds it under its mutex.
type share struct {
	inFlight      int // chunks started whose high watermark the reader has not reached
	unhanded      int // chunks started and not yet handed over
	inFlightBytes int // bytes of values of chunks read and not yet handed over
	moved         int // bytes of stream changes the reader passed since the last chunk started
	owed          int // what the stream must move before the next chunk while the output is behind
	last          int // bytes of the last rendered chunk's events
}

// mayStart reports whether the next chunk may start, given what the item queue holds.
func (s *share) mayStart(q queueView) bool {
	switch {
	case s.inFlight > 0 && s.inFlightBytes >= chunkBytesInFlight:
		return false
	case !q.behind:
		return s.unhanded == 0 && !q.chunkQueued
	default:
		return s.inFlight < chunksInFlight && s.moved >= s.owed
	}
}

// start records that a chunk started: the stream is owed as much as the last chunk was.
func (s *share) start() {
	s.inFlight++
	s.unhanded++
	s.moved, s.owed = 0, s.last
}

// read records the bytes of values a started chunk read.
func (s *share) read(n int) { s.inFlightBytes += n }

// rendered records the bytes of a chunk's events.
func (s *share) rendered(n int) {
	if n > 0 {
		s.last = n
	}
}

// reached records that the reader reached a chunk's high watermark.
func (s *share) reached() { s.inFlight-- }

// handed records that the reader pushed a chunk (of n bytes of values) into the item queue.
func (s *share) handed(n int) {
	s.unhanded--
	s.inFlightBytes -= n
}

// streamed records n bytes of stream changes passed by the reader.
func (s *share) streamed(n int) { s.moved += n }

// queueView is what the share needs to know of the item queue.
type queueView struct {
	behind      bool // a full bundle of stream changes waits: the output is behind the stream
	chunkQueued bool // a chunk part waits for the bundler
}

// view looks at the queued items for the share, and returns the channel signalling a change.
func (q *itemQueue) view() (queueView, <-chan struct{}) {
	var v queueView
	events, size := 0, 0
	_, changed := q.any(func(it *item) bool {
		if it.kind == itemChunk {
			v.chunkQueued = true
		} else {
			events, size = events+len(it.events), size+it.size
		}
		v.behind = events >= q.maxEv/2 || size >= q.maxBytes/2
		return v.behind && v.chunkQueued
	})
	return v, changed
}
