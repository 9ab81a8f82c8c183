package sink

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
)

// copyStream is the COPY data of an append batch, made while it is sent: each Read decodes the
// payloads of the next rows and encodes them, so the sink decodes the later rows of a batch while
// PostgreSQL already inserts the first ones, each on its own core. The stream keeps the column set
// and the format of the batch's first row; a row that does not fit (another column set, a value
// the binary encoder leaves to PostgreSQL, a payload that does not decode) stops it with
// errStreamStopped: the COPY fails, the transaction is rolled back, and the batch takes the path
// that decodes every payload first and groups rows by column set.
type copyStream struct {
	w       *writer
	msgs    []*Message
	pending []int // positions in msgs of the rows to write, in order
	next    int   // the next position in pending to encode
	rows    *rowBuf
	first   rowVals
	binary  bool
	sql     string
	out     []byte // encoded, not yet read
	buf     []byte // out's memory, reused chunk after chunk
	done    bool
	stopped atomic.Bool // set by Read, which runs in pgconn's goroutine
}

// streamChunkRows is how many rows each Read encodes: one CopyData message of a few KiB, small
// enough that PostgreSQL starts early, large enough that the writes cost little.
const streamChunkRows = 64

var errStreamStopped = errors.New("pgrelay: the batch leaves the streamed COPY for the grouped one")

// newCopyStream decodes the first pending row and returns the stream, or false when that row
// cannot go by COPY (or does not decode).
func (w *writer) newCopyStream(msgs []*Message, pending []int) (*copyStream, bool) {
	if len(pending) == 0 {
		return nil, false
	}
	s := &copyStream{w: w, msgs: msgs, pending: pending, rows: newRowBuf(msgs)}
	s.rows.rows = min(len(pending), streamChunkRows) // the column and value slabs hold one chunk (see fillChunk)
	m := msgs[pending[0]]
	if checkSize(m) != nil {
		return nil, false
	}
	first, _, _, err := w.rowFromPayload(m.Payload, m, s.rows)
	if err != nil {
		return nil, false
	}
	ok, bin := w.copyable(first.cols)
	if !ok {
		return nil, false
	}
	s.first, s.binary, s.sql = first, bin, w.copySQL(first, bin)
	return s, true
}

// Read implements io.Reader for pgconn's CopyFrom.
func (s *copyStream) Read(p []byte) (int, error) {
	if s.stopped.Load() {
		return 0, errStreamStopped
	}
	for len(s.out) == 0 {
		if s.done {
			return 0, io.EOF
		}
		if !s.fill() {
			return 0, errStreamStopped
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// prefill encodes the first chunks before the COPY starts (while the round trip before it runs).
func (s *copyStream) prefill(chunks int) {
	for ; chunks > 0 && !s.done && s.fill(); chunks-- {
	}
}

// fill encodes the next chunk of rows after out; false (and stopped) when a row does not fit the
// stream.
func (s *copyStream) fill() bool {
	if !s.fillChunk() {
		s.stopped.Store(true)
		return false
	}
	return true
}

func (s *copyStream) fillChunk() bool {
	out := s.out
	if len(out) == 0 {
		out = s.buf[:0]
	}
	if s.next == 0 && s.binary {
		out = append(out, copyBinaryHeader...)
	}
	if s.next > 0 { // the rows before are encoded: their column and value slabs are reused
		s.rows.cols, s.rows.vals, s.rows.hasLast = s.rows.cols[:0], s.rows.vals[:0], false
	}
	text := bytes.NewBuffer(out)
	for end := min(s.next+streamChunkRows, len(s.pending)); s.next < end; s.next++ {
		r := s.first
		if s.next > 0 {
			m := s.msgs[s.pending[s.next]]
			if checkSize(m) != nil {
				return false
			}
			var err error
			if r, _, _, err = s.w.rowFromPayload(m.Payload, m, s.rows); err != nil || r.sig != s.first.sig {
				return false
			}
		}
		if !s.binary {
			appendTextRow(text, r)
			continue
		}
		var ok bool
		if out, ok = s.w.appendBinaryRow(out, r); !ok {
			return false
		}
	}
	if !s.binary {
		out = text.Bytes()
	}
	if s.next == len(s.pending) {
		s.done = true
		if s.binary {
			out = append(out, copyBinaryTrailer...)
		}
	}
	s.buf, s.out = out, out
	return true
}

// streamGate pauses streaming after a batch had to leave it, so that a producer mixing column sets
// does not pay for a stopped COPY batch after batch.
type streamGate struct{ skip atomic.Int32 }

// streamPause is how many batches skip streaming after one left it.
const streamPause = 64

// open reports whether this batch may stream (counting down a pause).
func (g *streamGate) open() bool {
	for {
		n := g.skip.Load()
		if n <= 0 {
			return true
		}
		if g.skip.CompareAndSwap(n, n-1) {
			return false
		}
	}
}

func (g *streamGate) pause() { g.skip.Store(streamPause) }
