package source

import (
	"context"
	"errors"
	"slices"
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
	// Prev is the cover position of the batch in flight when this one was handed out behind
	// it ("" when nothing was); the write then never applies without that batch (queue.Cover.Prev).
	Prev     string
	expected bool               // registered with the source's chain (its window was open)
	sb       *queue.SourceBatch // what ForQueue gave out
	verdict  error              // the output's verdict, once resolved
	resolved bool               // Ack came; settled once every batch handed out before it is
	position string             // Cover.Position(), once
}

// pos is the cover's position (the pointer's pos), formatted once: by the goroutine that builds
// and hands out the batch (Next), before any other sees it.
func (b *Batch) pos() string {
	if b.position == "" {
		b.position = b.Cover.Position()
	}
	return b.position
}

// Receipt is the note the redis_queue output marks once this batch's cover is the stored
// pointer, so Ack need not read the pointer back (docs/batch-contract.md).
func (b *Batch) Receipt() *queue.CoverReceipt {
	if b.receipt == nil {
		b.receipt = queue.NewCoverReceipt(b.pos())
	}
	return b.receipt
}

// ForQueue is the batch's cover and receipt, as the redis_queue output takes them from the
// messages' context, with the source's chain; keyed: with the batch itself as the messages' keys,
// for messages made without metadata. Made once per batch: the hand-out sets its Prev.
func (b *Batch) ForQueue(keyed bool) *queue.SourceBatch {
	if b.sb == nil {
		b.sb = &queue.SourceBatch{Cover: *b.cover(), Receipt: b.Receipt()}
		if b.sess != nil {
			b.sb.Chain = b.sess.src.chain
		}
		if keyed {
			b.sb.Keys = b
		}
		b.chained()
	}
	return b.sb
}

// Len is the number of events (queue.Keys).
func (b *Batch) Len() int { return len(b.Events) }

// Keys returns event i's queue, partition, id and transaction (queue.Keys).
func (b *Batch) Keys(i int) (queue, partition, id, tx string) {
	e := &b.Events[i]
	return e.Queue, e.Partition, e.ID, e.Tx
}

// chained puts the batch's place in the chain (Prev, and the chain when registered) into what
// ForQueue gave out.
func (b *Batch) chained() {
	if b.sb == nil {
		return
	}
	b.sb.Cover.Prev, b.sb.Cover.Chain = b.Prev, nil
	if b.expected {
		b.sb.Cover.Chain = b.sb.Chain
	}
}

func (b *Batch) cover() *queue.Cover {
	return &queue.Cover{LeaseKey: b.LeaseKey, Fence: b.Fence, PointerKey: b.PointerKey, Pointer: b.CoverJSON, Pos: b.pos()}
}

// Next blocks until a batch may go and one is due, then returns it. With nothing in flight that
// is the next retry, the batch built ahead or a new bundle. While a batch is in flight, a full
// bundle already queued is built ahead and given to prepare (the input's conversion), so it is
// ready the moment the ack arrives; it is handed out before that ack only when the output writes
// the source's batches in order two at a time (the chain's window, queue.Chain): it then follows
// the batch in flight (Batch.Prev). No other batch, idle advance or pointer write goes while one
// is in flight. The pointer write of an output that does not write it is not waited for
// (coverWriter), unless maxUnwritten acknowledged batches wait for it.
func (s *Source) Next(ctx context.Context, prepare func(*Batch)) (*Batch, error) {
	s.nextMu.Lock()
	defer s.nextMu.Unlock()
	if b, err := s.waitTurn(ctx, prepare); b != nil || err != nil {
		return b, err
	}
	if err := s.covers.waitRoom(ctx); err != nil {
		return nil, err
	}
	b, err := s.next(ctx)
	if err != nil {
		return nil, err
	}
	s.handOut(b, nil)
	return b, nil
}

// waitTurn returns when nothing is in flight (nil: the next batch is built as usual), or with the
// full batch built ahead, handed out behind the one in flight while the chain's window has room
// and no batch waits for its re-send. It builds the next batch ahead while it waits.
func (s *Source) waitTurn(ctx context.Context, prepare func(*Batch)) (*Batch, error) {
	for {
		s.mu.Lock()
		n, changed, retrying := len(s.out), s.outCh, len(s.retry) > 0 || s.settling
		var last *Batch
		if n > 0 {
			last = s.out[n-1]
		}
		s.mu.Unlock()
		if n == 0 {
			return nil, nil
		}
		if n < s.chain.Window() && !retrying && last.expected {
			if b := s.takeAhead(); b != nil {
				s.handOut(b, last)
				return b, nil
			}
		}
		wake := s.buildAhead(ctx, prepare)
		if wake == nil {
			continue // built: hand it out if the window has room
		}
		select {
		case <-changed:
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// handOut records b as in flight, behind the batch behind when given (then b follows its write).
// While the chain's window is open every batch is registered with it, so the next can follow it.
func (s *Source) handOut(b *Batch, behind *Batch) {
	b.Prev, b.expected = "", false
	if s.chain.Window() > 1 && b.PointerKey != "" {
		b.expected = true
		s.chain.Expect(b.pos())
		if behind != nil {
			b.Prev = behind.pos()
		}
	}
	b.chained()
	s.mu.Lock()
	s.out = append(s.out, b)
	s.mu.Unlock()
}

// buildAhead builds a full batch while another is in flight, unless one is built already or a
// nacked batch waits for its re-send; it returns what to wait on before trying again.
func (s *Source) buildAhead(ctx context.Context, prepare func(*Batch)) <-chan struct{} {
	s.mu.Lock()
	sess, changed, busy := s.sess, s.sessCh, s.ahead != nil || len(s.retry) > 0
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
			if s.failing() {
				return nil, ErrNotReady
			}
			t := time.NewTimer(failingCheck) // the phase may turn failed after the session went
			select {
			case <-changed:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			t.Stop()
			continue
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
		case <-wait.ready:
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

// ErrNotReady is what Next returns, having handed out nothing, when the source has no replication
// session and its last one failed (phase error, or connecting after an error): the input tells
// Benthos it is not connected, so /ready answers 503, and Connect waits for the source again.
var ErrNotReady = errors.New("pg_cdc: not streaming")

// failingCheck is how often Next, waiting for a session, looks whether the source failed meanwhile.
const failingCheck = 250 * time.Millisecond

// failing reports whether the source's last session or start failed and no other runs yet.
func (s *Source) failing() bool {
	phase, err := s.Phase()
	return phase == PhaseError || phase == PhaseConnecting && err != nil
}

// takeRetry returns the first nacked batch of the replication run streaming now, after a backoff (batches of
// a replication run that ended are dropped: the next run starts from the pointer).
func (s *Source) takeRetry(ctx context.Context) *Batch {
	s.mu.Lock()
	var b *Batch
	for len(s.retry) > 0 && b == nil {
		if s.retry[0].sess == s.sess {
			b = s.retry[0]
		}
		s.retry = s.retry[1:]
	}
	n := s.attempts
	s.mu.Unlock()
	if b == nil {
		return nil
	}
	retry.Sleep(ctx, min(100*time.Millisecond<<min(n, 8), 10*time.Second))
	return b
}

// Ack takes the output's verdict on b. Verdicts are settled in the order the batches were handed
// out (a batch's verdict can come before the one of the batch handed out before it): settle. One
// Ack settles at a time (an Ack that comes meanwhile leaves its batch to it), and a settled batch
// leaves out only once settle queued its re-send or its cover: until then no Next hands out a
// batch that would skip it.
func (s *Source) Ack(ctx context.Context, b *Batch, err error) error {
	s.mu.Lock()
	b.verdict, b.resolved = err, true
	if s.settling {
		s.mu.Unlock()
		return nil // the Ack under way settles b once the batches before it are
	}
	s.settling = true
	for {
		n := 0
		for n < len(s.out) && s.out[n].resolved {
			n++
		}
		if n == 0 {
			break
		}
		done := slices.Clone(s.out[:n])
		s.mu.Unlock()
		for _, d := range done {
			s.settle(d)
		}
		s.mu.Lock()
		s.out = slices.Delete(s.out, 0, n)
		close(s.outCh)
		s.outCh = make(chan struct{})
	}
	s.settling = false
	s.mu.Unlock()
	return nil
}

// settle handles the verdict on b. Success: the batch goes to the cover writer, which makes sure
// the pointer reaches the cover (writing it when the output did not) and only then lets the
// reader tell PostgreSQL the new position; the next batch need not wait for that write. Fenced:
// stop and start over from the pointer. Anything else: send the same batch again, after every
// batch in flight has its verdict (a batch behind it is refused without it, ErrBehind) and
// before any new one.
func (s *Source) settle(b *Batch) {
	err := b.verdict
	b.verdict, b.resolved = nil, false
	if b.expected {
		s.chain.Settle(b.pos())
	}
	if err == nil {
		if b.sess.snap != nil && b.Cover.SnapshotChunks > 0 {
			b.sess.snap.delivered(b.Cover.SnapshotChunks)
		}
		s.covers.add(b)
		return
	}
	cur, _ := s.current()
	if cur != b.sess {
		return // a batch of an ended run: the run after it starts from the pointer it re-reads
	}
	if errcode.Is(err, errcode.Fenced) {
		b.sess.fail(err)
		return
	}
	pos := b.pos()
	s.mu.Lock()
	// in the order handed out: a re-sent batch that failed again goes before the ones behind it
	i := len(s.retry)
	for i > 0 && pos < s.retry[i-1].pos() {
		i--
	}
	s.retry = slices.Insert(s.retry, i, b)
	s.attempts++
	s.mu.Unlock()
	s.log.Warnf("batch up to %s not delivered, re-sending: %v", pos, err)
	s.countError(err)
}

// waitAcked blocks until no returned batch awaits its ack and every acknowledged cover is
// written, so a new session reads a pointer that no earlier batch can still move.
func (s *Source) waitAcked(ctx context.Context) error {
	for {
		s.mu.Lock()
		n, changed := len(s.out), s.outCh
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.covers.drain(ctx)
}
