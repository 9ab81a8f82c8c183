package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Two batches of one source in flight (docs/batch-contract.md "Two batches in flight").
//
// With a window of two, the source hands out a batch while the one before it is still being
// written, and names that batch's cover position as the new one's Cover.Prev. The writer overlaps
// the two writes on one connection. The first sends its entries, EXEC and the WATCH, reads and
// MULTI that prime the next write (write_tx.go), and opens its link: the connection, the priming
// reads and what they will show once its EXEC applied (every shard's offset after its entries).
// The second, which waited for that, queues its entries inside that MULTI with those offsets
// while Redis still runs the first EXEC. Once the first write has read its own replies it
// leaves the connection to the second, which reads what its WATCH saw after the first EXEC and
// sends EXEC only if that write applied, the lease still holds the fence, the stored pointer is
// exactly the first write's cover and every offset is the one it queued; else it sends DISCARD
// (nothing of it applied) and writes the batch the usual way. However a write with a Prev goes,
// it never applies unless the stored pointer is at or past Prev: a batch never goes in without
// the one before it (the check is the transaction's and the script's, errBehind otherwise).

// MaxWindow is the most batches of one source that are written at once.
const MaxWindow = 2

// Chain is one source's record of its batches being written, shared by the source (which makes
// it and registers each batch before handing it out) and the writer (through Cover.Chain).
type Chain struct {
	window atomic.Int32 // batches the output writes at once (Offer); 0 until it says

	mu    sync.Mutex
	links map[string]*link // by cover position: batches handed out and not yet settled
}

// NewChain returns a chain with a window of 1.
func NewChain() *Chain { return &Chain{links: map[string]*link{}} }

// Offer is the output's word that it writes up to n batches of the source at once, in the order
// the chain gives (its max_in_flight); the window is n, at most MaxWindow.
func (ch *Chain) Offer(n int) {
	n = min(max(n, 1), MaxWindow)
	if ch.window.Load() != int32(n) {
		ch.window.Store(int32(n))
	}
}

// Window is how many batches of the source may be in flight at once: 1 until an output offers more.
func (ch *Chain) Window() int {
	if ch == nil {
		return 1
	}
	return max(int(ch.window.Load()), 1)
}

// Expect registers the batch whose cover is at pos, before it is handed out, so a batch handed
// out after it can follow its write.
func (ch *Chain) Expect(pos string) {
	ch.mu.Lock()
	ch.links[pos] = &link{pos: pos, changed: make(chan struct{})}
	ch.mu.Unlock()
}

// Settle forgets the batch at pos (the source has its verdict): nothing follows it any more.
func (ch *Chain) Settle(pos string) { ch.finish(pos, true) }

// finish marks the link of the batch at pos final (nothing can follow its write on its
// connection any more), and forgets it when drop.
func (ch *Chain) finish(pos string, drop bool) {
	ch.mu.Lock()
	if l := ch.links[pos]; l != nil {
		if !l.final {
			l.final = true
			l.signal()
		}
		if drop {
			delete(ch.links, pos)
		}
	}
	ch.mu.Unlock()
}

// link is one registered batch's write, as a batch after it sees it; guarded by the chain's mu.
type link struct {
	pos     string
	changed chan struct{} // closed and replaced on every change
	final   bool          // its write ended (or the source settled it): nothing can follow it on its connection
	open    *opening      // set while its EXEC is out and a follower may queue behind it
	taken   bool          // a follower queued behind it: the connection is the follower's once the opening's read closes
	closed  bool          // its last opening read its own replies: no follower joins it
}

func (l *link) signal() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// opening is what an open write leaves a follower: its connection, the priming reads sent after
// its EXEC, and what they show once that EXEC applied.
type opening struct {
	conn                        *redisconn.RawConn
	leaseKey, fence, pointerKey string
	plan                        *plan   // the priming reads: every shard of the write's queues
	offs                        []int64 // each of those shards' offset once the write applied (plan.streams order)
	versions                    []int   // each queue's layout version
	// per opening, not per link: a write that retries opens its link again while the follower
	// of the first opening still waits for (and reads) these
	read    chan struct{} // made when it opens, closed once the write read its own replies
	applied bool          // its EXEC applied (valid once read is closed)
}

// follows reports whether a write of plan p with cover c can queue behind o: the same source and
// fence, and queues (and shard counts) whose every shard o's priming read.
func (o *opening) follows(p *plan, c *Cover) bool {
	return c.LeaseKey == o.leaseKey && c.Fence == o.fence && c.PointerKey == o.pointerKey &&
		slices.Equal(p.queues, o.plan.queues) && slices.Equal(p.counts, o.plan.counts)
}

// find returns the link of the batch at pos, nil when it is not registered (or settled).
func (ch *Chain) find(pos string) *link {
	if ch == nil || pos == "" {
		return nil
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.links[pos]
}

// opened records that the write of l sent its EXEC and priming reads on o.conn.
func (ch *Chain) opened(l *link, o *opening) {
	ch.mu.Lock()
	if !l.final {
		o.read = make(chan struct{})
		l.open, l.taken, l.closed = o, false, false
		l.signal()
	}
	ch.mu.Unlock()
}

// closeLink records that the write of l read its own replies (applied: its EXEC applied) and
// reports whether a follower took its connection. Either way no follower joins it any more.
func (ch *Chain) closeLink(l *link, applied bool) (taken bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	o := l.open
	if o == nil {
		return false
	}
	o.applied = applied
	close(o.read)
	l.open, l.closed = nil, true
	l.signal()
	return l.taken
}

// ended records that the write of the batch at pos returned: a follower that has not joined it
// writes the usual way.
func (ch *Chain) ended(pos string) { ch.finish(pos, false) }

// join waits until the write of c.Prev opens or ends. It returns that write's opening
// once this write (plan p) took its connection, or nil when it cannot follow (the write ended,
// or its opening does not cover p): write the usual way then.
func (ch *Chain) join(ctx context.Context, p *plan, c *Cover) (*opening, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	l := ch.links[c.Prev]
	for {
		switch {
		case l == nil || l.final || l.taken || l.closed:
			return nil, nil
		case l.open != nil:
			if !l.open.follows(p, c) {
				return nil, nil
			}
			l.taken = true
			return l.open, nil
		}
		if err := ch.await(ctx, l); err != nil {
			return nil, err
		}
	}
}

// await waits for the next change of l; the caller holds ch.mu, released meanwhile.
func (ch *Chain) await(ctx context.Context, l *link) error {
	wake := l.changed
	ch.mu.Unlock()
	defer ch.mu.Lock()
	select {
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitEnded waits until the write of the batch at pos returned (or the source settled it).
func (ch *Chain) waitEnded(ctx context.Context, pos string) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for l := ch.links[pos]; l != nil && !l.final; {
		if err := ch.await(ctx, l); err != nil {
			return err
		}
	}
	return nil
}

// follow writes one piece behind the write of c.Prev, on its connection, once that write opens
// for it (see the top of this file). done false: nothing of the piece applied, and the write of
// c.Prev has ended; write the piece the usual way.
func (w *Writer) follow(ctx context.Context, msgs []Message, c *Cover) (reply string, done bool, err error) {
	p, err := w.plan(ctx, msgs)
	if err != nil {
		// the usual way reads the shard counts again, and retries, once the write before ended
		return "", false, c.Chain.waitEnded(ctx, c.Prev)
	}
	o, err := c.Chain.join(ctx, p, c)
	if err != nil {
		return "", true, err
	}
	if o == nil {
		return "", false, c.Chain.waitEnded(ctx, c.Prev)
	}
	// queue the writes inside the MULTI of the priming, with the offsets the write before leaves
	idx := p.everyShardIndex() // where p's streams stand in o.plan
	offs := make([]int64, len(p.streams))
	for j := range offs {
		offs[j] = o.offs[idx[j]]
	}
	buf, _ := w.bufs.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	b, queued := w.appendWrites((*buf)[:0], p, msgs, offs, nil, o.versions, c, true)
	sendErr := o.conn.SendBehind(ctx, b)
	*buf = b
	w.bufs.Put(buf)
	<-o.read // the write before read its replies: the connection is this write's now
	conn := o.conn
	stop := conn.Watch(ctx)
	reply, err = w.followOn(ctx, conn, o, p, c, idx, offs, queued, sendErr)
	var h redisconn.Handed
	if errors.As(err, &h) {
		stop()
		err = h.Err // the next write owns the connection now
	} else {
		if !stop() {
			conn.Drop()
		}
		w.raw.Put(ctx, conn, err) // as Run ends: an error that says the server changed closes it
	}
	if errors.Is(err, errTxConflict) {
		w.conflicts.Add(1)
		reply, err = "", nil // a watched key changed before EXEC: nothing applied
	}
	if reply == "" && err == nil {
		return "", false, c.Chain.waitEnded(ctx, c.Prev)
	}
	return reply, true, err
}

// followOn is follow once it owns the connection: it reads what the WATCH saw after the write
// before, and the replies to the queued writes, then sends EXEC (and the next priming) if every
// check holds, else DISCARD. reply "" with a nil error: nothing applied, write the usual way.
func (w *Writer) followOn(ctx context.Context, conn *redisconn.RawConn, o *opening, p *plan, c *Cover,
	idx []int, offs []int64, queued int, sendErr error) (string, error) {
	if sendErr != nil || conn.Broken() {
		conn.Drop()
		return "", nil
	}
	st, err := w.readReads(conn, o.plan, c)
	if err != nil {
		conn.Drop()
		return "", nil
	}
	first, err := readQueued(conn, queued)
	if err != nil {
		conn.Drop()
		return "", nil
	}
	if !o.applied || first != nil || !followable(st, o, c) {
		if o.applied && first == nil {
			w.primeWait.Store(primeBackoff) // someone else changed the keys: the next writes read afresh
		}
		if err := w.discard(ctx, conn, nil); err != nil {
			conn.Drop()
		}
		return "", nil
	}
	after := slices.Clone(st.offs)
	for j := range idx {
		after[idx[j]] = offs[j]
	}
	pp := w.primePlan(p)
	var open *opening
	if pp != nil {
		open = &opening{conn: conn, leaseKey: c.LeaseKey, fence: c.Fence, pointerKey: c.PointerKey, plan: pp, offs: after,
			versions: st.versions}
	}
	return "ok", w.exec(ctx, conn, conn.Buf[:0], 0, pp, c, open)
}

// followable reports whether st, read after the write of o's EXEC, shows that write applied and
// nothing else changed: the fence held, the stored pointer at exactly the cover before this one,
// the queues' metas there, laid out as written, and every shard's offset the one o left.
func followable(st *txState, o *opening, c *Cover) bool {
	if st.fenced || st.layout != nil || slices.Contains(st.create, true) || !slices.Equal(st.offs, o.offs) ||
		!slices.Equal(st.versions, o.versions) {
		return false
	}
	pos, ok := storedPos(st.stored)
	return ok && pos == c.Prev
}

// readQueued reads the replies to n commands queued inside MULTI: the first that refused its
// command (the EXEC would abort), or an I/O error.
func readQueued(conn *redisconn.RawConn, n int) (first, ioErr error) {
	for left := n; left > 0; left-- {
		if left -= conn.SkipStatus("QUEUED", left); left == 0 {
			break
		}
		rep, err := conn.Read()
		if err != nil {
			return nil, err
		}
		if first == nil {
			first = rep.Err()
		}
	}
	return first, nil
}
