package source

// The snapshot's share of the pipeline. A chunk's rows enter the item queue where the WAL reader
// meets its high watermark, so the snapshot cannot overtake the stream; it can only decide when
// to read the next chunk. The rule, counted in chunks and bytes:
//
//   - Pipeline: while fewer than chunksAhead chunks are started and not yet written (their last
//     part acknowledged by the output), the next chunk goes: it is read while the WAL reader
//     reaches the previous one's high watermark and the output writes it, and it never waits for
//     a quiet stream. This is all an idle stream gives the snapshot.
//   - Share: beyond that, one more chunk goes each time the stream moved (the WAL reader passed)
//     at least 1/snapshotWeight of the last chunk's bytes since the previous chunk started: a
//     weighted round robin that gives the snapshot up to two bytes for each byte of the stream,
//     so the stream keeps at least a third of what the pipeline moves beyond the snapshot's
//     chunksAhead chunks, however busy it is. While
//     the stream works off a backlog it moves fast, so chunks are read ahead and wait, ready,
//     where their high watermarks are; once the stream reaches them they go back to back.
//   - Bounds: at most chunksInFlight chunks whose high watermark the reader has not reached, and
//     chunks read and not yet in the item queue hold at most chunkBytesInFlight bytes of values
//     and rendered events (the first always goes). This also bounds what the read-ahead chunks
//     add to the stream's lag: they lie in the WAL before the changes written after them.
//
// No clock takes part, so the share holds however slow or loaded the machine is.
const (
	chunksAhead        = 4
	snapshotWeight     = 2
	chunksInFlight     = 64
	chunkBytesInFlight = 32 << 20
)

// share is the rule's state; the snapshotter holds it under its mutex.
type share struct {
	inFlight      int      // chunks started whose high watermark the reader has not reached
	unhanded      int      // chunks started and not yet handed over
	unwritten     []uint64 // per chunk handed over and not yet written: the part count acknowledging it
	acked         uint64   // the acknowledged part count
	inFlightBytes int      // bytes of values and events of chunks read and not yet handed over
	moved         int      // bytes of stream changes the reader passed since the last chunk started
	owed          int      // the last rendered chunk's bytes when the last chunk started
	last          int      // bytes of the last rendered chunk's events
}

// mayStart reports whether the next chunk may start.
func (s *share) mayStart() bool {
	switch {
	case s.inFlight > 0 && s.inFlightBytes >= chunkBytesInFlight, s.inFlight >= chunksInFlight:
		return false
	case s.unhanded+len(s.unwritten) < chunksAhead:
		return true
	default:
		return s.moved*snapshotWeight >= s.owed
	}
}

// start records that a chunk started: the stream's share is counted afresh.
func (s *share) start() {
	s.inFlight++
	s.unhanded++
	s.moved, s.owed = 0, s.last
}

// abandoned records that a started chunk was given up before its read (its high watermark never
// emitted).
func (s *share) abandoned() {
	s.inFlight--
	s.unhanded--
}

// read records the bytes of values a started chunk read.
func (s *share) read(n int) { s.inFlightBytes += n }

// rendered records the bytes of a chunk's events.
func (s *share) rendered(n int) {
	s.inFlightBytes += n
	if n > 0 {
		s.last = n
	}
}

// reached records that the reader reached a chunk's high watermark.
func (s *share) reached() { s.inFlight-- }

// handed records that the reader pushed a chunk into the item queue: n bytes of values and events
// left the snapshotter, and the chunk is written once the acknowledged part count reaches parts.
func (s *share) handed(n int, parts uint64) {
	s.unhanded--
	s.inFlightBytes -= n
	if parts > s.acked {
		s.unwritten = append(s.unwritten, parts)
	}
}

// written records an acknowledged part count; it reports whether a chunk became written.
func (s *share) written(parts uint64) bool {
	s.acked = max(s.acked, parts)
	n := 0
	for n < len(s.unwritten) && s.unwritten[n] <= s.acked {
		n++
	}
	s.unwritten = s.unwritten[n:]
	return n > 0
}

// streamed records n bytes of stream changes passed by the reader; it reports whether they just
// earned the snapshot its next chunk.
func (s *share) streamed(n int) bool {
	before := s.moved*snapshotWeight >= s.owed
	s.moved += n
	return !before && s.moved*snapshotWeight >= s.owed
}
