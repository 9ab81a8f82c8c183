package source

import (
	"context"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/retry"
)

// Event is one change event on its way to the queue, with the metadata of docs/batch-contract.md.
type Event struct {
	Queue, Partition, ID, Tx string
	Op, Table, LSN           string
	Xid                      uint32
	CreatedMs                int64
	Payload                  []byte
}

func (e *Event) size() int { return len(e.Payload) + len(e.Queue) + len(e.Partition) + len(e.ID) + 64 }

// Batch is one bundle of events with the pointer it moves to.
type Batch struct {
	Events     []Event
	Cover      pointer.Pointer
	CoverJSON  []byte
	LeaseKey   string
	Fence      string
	PointerKey string
	// Out is the consumer's form of the batch (the input's Benthos messages), made by Next's
	// prepare when the batch was built ahead; nil otherwise.
	Out     any
	sess    *session
	txns    int                 // transactions completed by this batch
	receipt *queue.CoverReceipt // marked by redis_queue once the cover is the stored pointer
}

// Receipt is the note the redis_queue output marks once this batch's cover is the stored
// pointer, so Ack need not read the pointer back (docs/batch-contract.md).
func (b *Batch) Receipt() *queue.CoverReceipt {
	if b.receipt == nil {
		b.receipt = queue.NewCoverReceipt(b.Cover.Position())
	}
	return b.receipt
}

// ForQueue is the batch's cover and receipt, as the redis_queue output takes them from the
// messages' context.
func (b *Batch) ForQueue() *queue.SourceBatch {
	return &queue.SourceBatch{Cover: *b.cover(), Receipt: b.Receipt()}
}

func (b *Batch) cover() *queue.Cover {
	return &queue.Cover{LeaseKey: b.LeaseKey, Fence: b.Fence, PointerKey: b.PointerKey, Pointer: b.CoverJSON, Pos: b.Cover.Position()}
}

// Next blocks until the previous batch is acknowledged and a new one is due, then returns it.
// While the previous batch is in flight, a full bundle already queued is built ahead and given
// to prepare (the input's conversion), so it is ready the moment the ack arrives; it is still
// handed out only after that ack (one unacknowledged batch at a time, DESIGN §5). The pointer
// write of an output that does not write it is not waited for (coverWriter), unless
// maxUnwritten acknowledged batches wait for it.
func (s *Source) Next(ctx context.Context, prepare func(*Batch)) (*Batch, error) {
	s.nextMu.Lock()
	defer s.nextMu.Unlock()
	if err := s.waitTurn(ctx, prepare); err != nil {
		return nil, err
	}
	if err := s.covers.waitRoom(ctx); err != nil {
		<-s.inflight
		return nil, err
	}
	b, err := s.next(ctx)
	if err != nil {
		<-s.inflight
		return nil, err
	}
	s.unacked <- struct{}{}
	return b, nil
}

// waitTurn takes the in-flight slot (the previous batch is acknowledged), building the next
// batch ahead while it waits.
func (s *Source) waitTurn(ctx context.Context, prepare func(*Batch)) error {
	for {
		select {
		case s.inflight <- struct{}{}:
			return nil
		default:
		}
		wake := s.buildAhead(ctx, prepare)
		select {
		case s.inflight <- struct{}{}:
			return nil
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// buildAhead builds a full batch while another is in flight, unless one is built already or a
// nacked batch waits for its re-send; it returns what to wait on before trying again.
func (s *Source) buildAhead(ctx context.Context, prepare func(*Batch)) <-chan struct{} {
	s.mu.Lock()
	sess, changed, busy := s.sess, s.sessCh, s.ahead != nil || s.retry != nil
	s.mu.Unlock()
	if sess == nil || busy {
		return changed
	}
	full := sess.q.whenFull()
	select {
	case <-full:
	default:
		return full
	}
	b, _, err := sess.build(ctx, true)
	if err != nil {
		sess.fail(err)
	}
	if b == nil {
		return changed
	}
	if prepare != nil {
		prepare(b)
	}
	s.mu.Lock()
	if s.sess == sess {
		s.ahead = b
	}
	s.mu.Unlock()
	return nil
}

// takeAhead returns the batch built ahead, if it belongs to the current, still running session
// (a failed session's batch would follow a batch that may not be in).
func (s *Source) takeAhead() *Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.ahead
	s.ahead = nil
	if b != nil && b.sess == s.sess && b.sess.ctx.Err() == nil {
		return b
	}
	return nil
}

func (s *Source) next(ctx context.Context) (*Batch, error) {
	if b := s.takeRetry(ctx); b != nil {
		return b, nil
	}
	if b := s.takeAhead(); b != nil {
		return b, nil
	}
	for {
		sess, changed := s.current()
		if sess == nil {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		b, wait, err := sess.bundle(ctx)
		if err != nil {
			sess.fail(err)
		}
		if b != nil {
			return b, nil
		}
		t := time.NewTimer(wait.after)
		select {
		case <-wait.ch:
		case <-t.C:
		case <-changed:
		case <-sess.ctx.Done():
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// takeRetry returns the nacked batch of the current session, after a backoff.
func (s *Source) takeRetry(ctx context.Context) *Batch {
	s.mu.Lock()
	b, n := s.retry, s.attempts
	s.retry = nil
	ok := b != nil && b.sess == s.sess
	s.mu.Unlock()
	if !ok {
		return nil
	}
	retry.Sleep(ctx, min(100*time.Millisecond<<min(n, 8), 10*time.Second))
	return b
}

// Ack handles the output's verdict on b. Success: the batch goes to the cover writer, which
// makes sure the pointer reaches the cover (writing it when the output did not) and only then
// lets the reader tell PostgreSQL the new position; the next batch need not wait for that write.
// Fenced: stop and start over from the pointer. Anything else: re-send the same batch.
func (s *Source) Ack(ctx context.Context, b *Batch, err error) error {
	defer func() {
		<-s.unacked
		<-s.inflight
	}()
	if err == nil {
		if b.sess.snap != nil && b.Cover.SnapshotChunks > 0 {
			b.sess.snap.delivered(b.Cover.SnapshotChunks)
		}
		s.covers.add(b)
		return nil
	}
	cur, _ := s.current()
	if cur != b.sess {
		return nil // a batch of an ended run: the run after it starts from the pointer it re-reads
	}
	if errcode.Is(err, errcode.Fenced) {
		b.sess.fail(err)
		return nil
	}
	s.mu.Lock()
	s.retry = b
	s.attempts++
	s.mu.Unlock()
	s.log.Warnf("pg_cdc %s: batch up to %s not delivered, re-sending: %v", s.cfg.Name, b.Cover.Position(), err)
	return nil
}

// waitAcked blocks until no returned batch awaits its ack and every acknowledged cover is
// written, so a new session reads a pointer that no earlier batch can still move.
func (s *Source) waitAcked(ctx context.Context) error {
	for len(s.unacked) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		retry.Sleep(ctx, 20*time.Millisecond)
	}
	return s.covers.drain(ctx)
}
