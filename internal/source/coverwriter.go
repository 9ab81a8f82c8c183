package source

import (
	"context"
	"sync"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/retry"
)

// maxUnwritten is how many acknowledged batches may wait for their pointer write before Next
// hands out no more: the output runs at most this far ahead of the stored pointer (at-least-once
// for such outputs: a restart repeats what is past the pointer), and a Redis that cannot take the
// write stops the source instead of letting it run on.
const maxUnwritten = 16

// coverWriter writes the pointer for the batches an output acknowledged without writing it (every
// output but redis_queue), in the background so the next batch need not wait for the round trip:
// one write at a time, always of the newest cover acknowledged, which covers every batch before
// it. A batch counts as acknowledged (the session's acked: PostgreSQL is told its position, the
// snapshot its chunks) only once a write at or past its cover succeeded, in the order the batches
// were handed out. A fenced write ends the session; any other failure is retried until the write
// succeeds, a fence stops it or the source closes.
type coverWriter struct {
	src     *Source
	ctx     context.Context // the source's life: cancelled by Close after the last write
	mu      sync.Mutex
	pending []*Batch      // acknowledged, waiting for a write at or past their covers, in order
	writing int           // batches the write in flight covers (taken from pending)
	busy    bool          // the write loop runs (it owns what it took from pending)
	changed chan struct{} // closed and replaced whenever pending or busy change
}

func newCoverWriter(s *Source, ctx context.Context) *coverWriter {
	return &coverWriter{src: s, ctx: ctx, changed: make(chan struct{})}
}

// signal wakes every waiter; the caller holds the lock.
func (w *coverWriter) signal() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// add takes an acknowledged batch. With nothing waiting for a write and the cover already the
// stored pointer (redis_queue marked the receipt), it is acknowledged at once; otherwise it joins
// the queue behind the batches before it and the write loop runs.
func (w *coverWriter) add(b *Batch) {
	w.mu.Lock()
	if !w.busy && len(w.pending) == 0 && b.receipt.Done() {
		w.mu.Unlock()
		w.src.acked(b)
		return
	}
	w.pending = append(w.pending, b)
	start := !w.busy
	w.busy = true
	w.signal()
	w.mu.Unlock()
	if start {
		go w.loop()
	}
}

// loop writes the newest waiting cover, acknowledges every batch it covers, and goes on until
// nothing waits.
func (w *coverWriter) loop() {
	for {
		w.mu.Lock()
		batches := w.pending
		w.pending = nil
		w.writing = len(batches)
		w.signal() // room for more batches, or idle
		if len(batches) == 0 {
			w.busy = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		w.write(batches)
	}
}

// write stores the last batch's cover (unless the output already did) and acknowledges the
// batches in order; a fence fails their session and drops them.
func (w *coverWriter) write(batches []*Batch) {
	last := batches[len(batches)-1]
	for attempt := 0; !last.receipt.Done(); attempt++ {
		_, err := w.src.writer.Write(w.ctx, nil, last.cover())
		if err == nil {
			break
		}
		if errcode.Is(err, errcode.Fenced) {
			if cur, _ := w.src.current(); cur == last.sess {
				last.sess.fail(err)
			}
			return
		}
		if w.ctx.Err() != nil {
			return // closed: the pointer stays where it was, and the restart repeats what is past it
		}
		w.src.log.Warnf("pointer to %s not written, retrying: %v", last.Cover.Position(), err)
		retry.Sleep(w.ctx, min(100*time.Millisecond<<min(attempt, 8), 10*time.Second))
	}
	for _, b := range batches {
		w.src.acked(b)
	}
}

// waitRoom blocks while maxUnwritten acknowledged batches wait for their pointer write (the one
// in flight or the next).
func (w *coverWriter) waitRoom(ctx context.Context) error {
	for {
		w.mu.Lock()
		full, ch := w.writing+len(w.pending) >= maxUnwritten, w.changed
		w.mu.Unlock()
		if !full {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain blocks until every acknowledged batch's cover is written (or its write given up).
func (w *coverWriter) drain(ctx context.Context) error {
	for {
		w.mu.Lock()
		idle, ch := !w.busy && len(w.pending) == 0, w.changed
		w.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// acked hands b to its session's acked if that session still streams (a batch of an ended
// session changes nothing: the next session reads the pointer).
func (s *Source) acked(b *Batch) {
	if cur, _ := s.current(); cur != b.sess {
		return
	}
	s.mu.Lock()
	resent := s.attempts
	s.attempts = 0
	s.mu.Unlock()
	if resent > 0 { // the warnings of its re-sends get their end
		s.log.Infof("batch up to %s delivered after %d re-sends", b.pos(), resent)
	}
	b.sess.acked(b)
}
