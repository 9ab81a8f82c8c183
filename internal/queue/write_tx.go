package queue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// A piece of a batch is written as one optimistic transaction on one connection of the queue's
// master. First round trip: WATCH the lease, the pointer, each queue's meta hash and each shard
// stream touched (consumers' XREADGROUP, XACK and XAUTOCLAIM do not count as changes), read them
// (and the type of each shard stream touched), MULTI. Here: check the fence, the cover, the shard
// counts and the layout, and compute each entry's offset. Second round trip: the meta of a new
// queue, the XADDs, the new offsets, the pointer, EXEC (and WAIT with durability replicas); or
// DISCARD when a check failed. MULTI goes first, with the reads, so that the writes reach Redis
// only once it confirmed the transaction: each is then queued, or refused, which aborts EXEC.
// EXEC runs only if no watched key changed since the WATCH, so the checks still hold when the
// writes apply, as inside the Lua script, which costs Redis ~2 µs more per entry (each
// redis.call converts its arguments from Lua strings). When EXEC aborts (another writer of the
// queue, a renewal of the lease, a new owner, another pointer), nothing was written and the
// piece is read and checked again; after maxTxConflicts aborts the script writes it, as it
// cannot conflict. The commands are encoded straight into one buffer on a connection of
// redisconn.Raw: go-redis would build, box and parse an object per command.
//
// The first round trip of the next write travels with this one's EXEC: after EXEC the connection
// WATCHes the same keys again, reads them (every shard of the queues, as the next write's
// shards are not known yet) and opens MULTI, and goes back to the pool so (primed). The next
// write of the same source and queues that takes it checks against those reads and sends only
// its writes and EXEC: one round trip per write. The reads stay valid as in the two-round-trip
// write, because the WATCH came first: a change of a watched key since (a lease renewal, another
// writer) aborts the EXEC, and the piece is read and checked again. When those new reads show that
// something besides this writer changed (the lease's fence, the pointer, a shard's offset or a
// queue's meta: another owner or another writer of the queue, which would abort every primed
// write), the writer does not prime for the next primeBackoff writes. A renewal of its own lease
// rewrites the lease key unchanged: the reads then match the aborted write's, and priming goes on.

// maxTxConflicts is how many aborted EXECs one piece tolerates before it is written by the script.
const maxTxConflicts = 3

// maxPrimedStreams: a write primes the next one only when its queues have at most this many
// shards in all (each costs a TYPE and a field of the meta read per write).
const maxPrimedStreams = 64

// primeBackoff is how many writes do not use or send a priming after a primed EXEC aborted for a
// change by someone else.
const primeBackoff = 64

// ownView is what a primed write that aborted had read of the keys others may change, compared
// with what the piece's next attempt reads (sameView).
type ownView struct {
	fenced   bool
	stored   string
	ptr      bool
	create   []bool
	versions []int
	offs     []int64
}

func viewOf(st *txState) *ownView {
	return &ownView{fenced: st.fenced, stored: st.stored, ptr: st.ptr, create: slices.Clone(st.create),
		versions: slices.Clone(st.versions), offs: slices.Clone(st.offs)}
}

// sameView reports whether st reads what v read: the abort changed nothing of another owner or
// writer (the lease still ours with the same fence, the pointer and the queues where they were).
func (v *ownView) sameView(st *txState) bool {
	return !v.fenced && !st.fenced && v.stored == st.stored && v.ptr == st.ptr && slices.Equal(v.create, st.create) &&
		slices.Equal(v.versions, st.versions) && slices.Equal(v.offs, st.offs)
}

// primed is what a write left open on its connection for the next one (conn.State): the keys it
// WATCHes, what it read after the WATCH, over every shard of the queues, and an open MULTI.
type primed struct {
	leaseKey, fence, pointerKey string
	plan                        *plan // queues, counts and every shard of each (streams in queue, shard order)
	st                          *txState
}

// stateFor is the state of piece p with cover c from the primed reads, or nil when they do not
// cover it (another source, fence or queue, or another shard count).
func (pr *primed) stateFor(p *plan, c *Cover) *txState {
	if c.LeaseKey != pr.leaseKey || c.Fence != pr.fence || c.PointerKey != pr.pointerKey ||
		!slices.Equal(p.queues, pr.plan.queues) || !slices.Equal(p.counts, pr.plan.counts) {
		return nil
	}
	st := &txState{fenced: pr.st.fenced, stored: pr.st.stored, ptr: pr.st.ptr, create: pr.st.create, versions: pr.st.versions, layout: pr.st.queueErr,
		offs: make([]int64, len(p.streams)), all: pr.st.offs, allIdx: p.everyShardIndex()}
	for j, k := range st.allIdx {
		st.offs[j] = pr.st.offs[k]
		if st.layout == nil {
			st.layout = pr.st.streamErr[k]
		}
	}
	return st
}

// primePlan is the plan of the reads that prime the next write after p: every shard of p's
// queues; nil when they are too many or priming is backing off.
func (w *Writer) primePlan(p *plan) *plan {
	total := 0
	for _, n := range p.counts {
		total += n
	}
	if total > maxPrimedStreams || w.primeWait.Load() > 0 {
		return nil
	}
	pp := &plan{queues: p.queues, counts: p.counts, keys: p.keys, streams: make([]streamRef, 0, total)}
	for i, n := range p.counts {
		for s := range n {
			pp.streams = append(pp.streams, streamRef{i, s})
		}
	}
	return pp
}

// errTxConflict: a watched key changed between the WATCH and EXEC; nothing was written. The
// connection stays in step (every reply read, the next write's reads primed on it), so it goes
// back to the pool (redisconn.InStep): two sources writing one queue conflict often.
var errTxConflict error = txConflict{}

type txConflict struct{}

func (txConflict) Error() string { return "a watched key changed before EXEC" }
func (txConflict) InStep() bool  { return true }

// errTxUnavailable: the piece cannot be written as a transaction here (a client type without
// raw connections, or a Redis Cluster slot being migrated); the script writes it.
var errTxUnavailable = errors.New("no transaction on one master connection")

// plan is where a piece's messages go: its queues (with the shard count used for each), the
// (queue, shard) streams it touches, and each message's stream.
type plan struct {
	queues    []string
	counts    []int
	keys      []*queueKeys // each queue's keys (Writer.keys)
	streams   []streamRef
	msgStream []int // index into streams, per message
}

// everyShardIndex is where each of p's streams stands among every shard of p's queues, in queue
// then shard order (the streams of a priming plan, primePlan).
func (p *plan) everyShardIndex() []int {
	base := make([]int, len(p.counts)) // index of shard 0 of each queue
	for i := 1; i < len(base); i++ {
		base[i] = base[i-1] + p.counts[i-1]
	}
	idx := make([]int, len(p.streams))
	for j, s := range p.streams {
		idx[j] = base[s.queue] + s.shard
	}
	return idx
}

type streamRef struct {
	queue int // index into queues
	shard int
}

// plan groups msgs by queue and shard; the shard count of each queue is looked up once. A batch
// usually has one queue, so the previous message's queue is tried first, and each queue's
// streams are found by shard number in a slice, with no hashing per message.
func (w *Writer) plan(ctx context.Context, msgs []Message) (*plan, error) {
	p := &plan{msgStream: make([]int, len(msgs))}
	var streamOf [][]int32 // per queue, per shard: index into p.streams + 1 (0: not touched yet)
	var queueIdx map[string]int
	qi := -1
	for i := range msgs {
		if q := msgs[i].Queue; qi < 0 || q != p.queues[qi] {
			var ok bool
			if qi, ok = queueIdx[q]; !ok {
				n, err := w.shardCount(ctx, q)
				if err != nil {
					return nil, err
				}
				qi = len(p.queues)
				p.queues, p.counts = append(p.queues, q), append(p.counts, n)
				p.keys = append(p.keys, w.keys.of(q, n))
				streamOf = append(streamOf, make([]int32, n))
				if queueIdx == nil {
					queueIdx = map[string]int{}
				}
				queueIdx[q] = qi
			}
		}
		shard := Shard(msgs[i].Partition, p.counts[qi])
		j := int(streamOf[qi][shard]) - 1
		if j < 0 {
			j = len(p.streams)
			p.streams = append(p.streams, streamRef{qi, shard})
			streamOf[qi][shard] = int32(j + 1)
		}
		p.msgStream[i] = j
	}
	return p, nil
}

// errShardsChanged: a queue's stored shard count is not the one the piece was planned with (the
// queue was created again); the writer reads the counts again once.
type errShardsChanged struct {
	meta          string
	stored, given string
}

func (e *errShardsChanged) Error() string {
	return fmt.Sprintf("%s: stored shard count %s, written with %s", e.meta, e.stored, e.given)
}

// writeTx writes one piece as an optimistic transaction and replies as the script does ("ok",
// "duplicate", "fenced"). errTxConflict: nothing was written, try again (with the same aborted,
// which notes what an aborted primed write had read). errTxUnavailable: use the script.
func (w *Writer) writeTx(ctx context.Context, msgs []Message, c *Cover, last bool, aborted **ownView) (string, error) {
	p, err := w.plan(ctx, msgs)
	if err != nil {
		return "", err
	}
	key := c.LeaseKey
	if key == "" {
		key = c.PointerKey
	}
	if key == "" {
		key = p.keys[0].meta
	}
	var reply string
	err = w.raw.Run(ctx, key, func(conn *redisconn.RawConn) error {
		var err error
		reply, err = w.txAttempt(ctx, conn, p, msgs, c, last, aborted)
		return err
	})
	if errors.Is(err, redisconn.ErrRawUnavailable) || redis.HasErrorPrefix(err, "ASK") {
		return "", errTxUnavailable
	}
	return reply, err
}

// txState is what the first round trip read.
type txState struct {
	fenced    bool
	stored    string // the stored pointer ("" when there is none)
	ptr       bool   // there is a stored pointer (perhaps the empty string, which is not JSON)
	create    []bool // per queue: meta missing, create it
	versions  []int  // per queue: its layout version (the writer's CreateVersion for a queue to create)
	offs      []int64
	layout    error   // the first way the queue's keys do not follow the layout (checked after the fence and the cover)
	queueErr  error   // the first way a queue's meta does not (shards, version; also in layout)
	streamErr []error // per stream: its key or its meta offset does not (also in layout)
	// from primed reads: every shard's offset (the priming plan's order) and each stream's index in it
	all    []int64
	allIdx []int
}

// txAttempt is one WATCH … EXEC on conn; the WATCH and reads are those a previous write left
// on conn when they cover this piece. After a primed attempt of the piece aborted (*aborted), it
// backs priming off unless this attempt's reads match that one's.
func (w *Writer) txAttempt(ctx context.Context, conn *redisconn.RawConn, p *plan, msgs []Message, c *Cover, last bool, aborted **ownView) (string, error) {
	pr, _ := conn.State.(*primed)
	conn.State = nil
	countDown(&w.primeWait)
	var st *txState
	if pr != nil && w.primeWait.Load() == 0 {
		st = pr.stateFor(p, c)
	}
	fromPrimed := st != nil
	if st == nil {
		var err error
		if st, err = w.txRead(ctx, conn, p, c, pr != nil); err != nil {
			return "", w.discard(ctx, conn, err)
		}
	}
	if *aborted != nil {
		if !(*aborted).sameView(st) {
			w.primeWait.Store(primeBackoff)
		}
		*aborted = nil
	}
	var view *ownView
	if fromPrimed {
		view = viewOf(st) // before txWrite advances st.offs
	}
	reply, err := w.txWrite(ctx, conn, st, p, msgs, c, last)
	if fromPrimed && reply == "behind" && err == nil {
		// the primed reads may be older than the write of Prev (on another connection): the WATCH
		// guards only an EXEC, and the pointer only moves on, so read afresh before refusing
		if st, err = w.txRead(ctx, conn, p, c, false); err != nil {
			return "", w.discard(ctx, conn, err)
		}
		return w.txWrite(ctx, conn, st, p, msgs, c, last)
	}
	if fromPrimed && errors.Is(err, errTxConflict) {
		*aborted = view
	}
	return reply, err
}

// txWrite makes the checks of st and sends the writes and EXEC (or DISCARD).
func (w *Writer) txWrite(ctx context.Context, conn *redisconn.RawConn, st *txState, p *plan, msgs []Message, c *Cover, last bool) (string, error) {
	// the checks, in the script's order: fence, cover, each queue's layout
	if st.fenced {
		return "fenced", w.discard(ctx, conn, nil)
	}
	if c.PointerKey != "" && st.ptr {
		pos, ok := storedPos(st.stored)
		if !ok {
			return "", w.discard(ctx, conn, errcode.New(errcode.PointerCorrupt,
				fmt.Sprintf("the stored source pointer %s is not JSON with a pos field", c.PointerKey),
				"run pgrelay resync for the source, or delete the pointer key if the source is being reset"))
		}
		if pos >= c.Pos {
			if w.conf.Durability.Replicas <= 0 {
				return "duplicate", w.discard(ctx, conn, nil)
			}
			// rewrite the pointer unchanged: a write of this connection for WAIT to wait for
			b := redisconn.AppendCommand(conn.Buf[:0], "SET", c.PointerKey, st.stored, "KEEPTTL")
			return "duplicate", w.exec(ctx, conn, b, 1, nil, c, nil)
		}
	}
	if c.Prev != "" && c.PointerKey != "" {
		if pos, _ := storedPos(st.stored); !st.ptr || pos < c.Prev {
			return "behind", w.discard(ctx, conn, nil)
		}
	}
	if st.layout != nil {
		return "", w.discard(ctx, conn, st.layout)
	}
	if w.beforeExec != nil {
		w.beforeExec()
	}

	b, queued := w.appendWrites(conn.Buf[:0], p, msgs, st.offs, st.create, st.versions, c, last)
	pp := w.primePlan(p)
	var open *opening
	if st.all != nil && pp != nil && c.Chain != nil {
		after := slices.Clone(st.all)
		for j, k := range st.allIdx {
			after[k] = st.offs[j]
		}
		open = &opening{conn: conn, leaseKey: c.LeaseKey, fence: c.Fence, pointerKey: c.PointerKey, plan: pp, offs: after,
			versions: st.versions}
	}
	return "ok", w.exec(ctx, conn, b, queued, pp, c, open)
}

// appendWrites appends a piece's writes (the meta of each queue to create, the entries from offs
// on in each queue's layout version, advancing offs, each queue's new offsets, the pointer) and
// returns how many commands they are.
func (w *Writer) appendWrites(b []byte, p *plan, msgs []Message, offs []int64, create []bool, versions []int, c *Cover, last bool) ([]byte, int) {
	queued := 0
	for i := range p.queues {
		if create != nil && create[i] {
			b = redisconn.AppendCommand(b, "HSET", p.keys[i].meta, "shards", strconv.Itoa(p.counts[i]), "version", strconv.Itoa(w.conf.CreateVersion))
			queued++
		}
	}
	var xadds int
	b, xadds = w.appendXAdds(b, p, msgs, offs, versions)
	queued += xadds
	for i, k := range p.keys {
		n := 0
		for _, s := range p.streams {
			if s.queue == i {
				n++
			}
		}
		b = redisconn.AppendArrayLen(b, 2+2*n)
		b = redisconn.AppendBulk(b, "HSET")
		b = redisconn.AppendBulk(b, k.meta)
		for j, s := range p.streams {
			if s.queue == i {
				b = redisconn.AppendBulk(b, k.offs[s.shard])
				b = redisconn.AppendBulkInt(b, offs[j])
			}
		}
		queued++
	}
	if c.PointerKey != "" && last {
		b = redisconn.AppendArrayLen(b, 3)
		b = redisconn.AppendBulk(b, "SET")
		b = redisconn.AppendBulk(b, c.PointerKey)
		b = redisconn.AppendBulk(b, c.Pointer)
		queued++
	}
	return b, queued
}

// txRead sends the WATCH and the reads and reads their replies (all of them, so the connection
// stays in step, whatever they are). reset: conn was left in MULTI by a priming this piece does
// not use; DISCARD it (and its WATCH) first.
func (w *Writer) txRead(ctx context.Context, conn *redisconn.RawConn, p *plan, c *Cover, reset bool) (*txState, error) {
	b := conn.Buf[:0]
	if reset {
		b = redisconn.AppendCommand(b, "DISCARD")
	}
	b = w.appendReads(b, p, c)
	conn.Buf = b
	if err := conn.Send(ctx, b, 0); err != nil {
		return nil, err
	}
	if reset {
		if _, err := conn.Read(); err != nil { // DISCARD: +OK
			return nil, err
		}
	}
	return w.readReads(conn, p, c)
}

// appendReads appends WATCH, the reads of the keys of p's queues and streams and c, and MULTI.
func (w *Writer) appendReads(b []byte, p *plan, c *Cover) []byte {
	// the shard streams too: their TYPE is read here and trusted until EXEC (for a priming, by a
	// later write), and an XADD to a key of another type fails inside EXEC, after the others applied
	nkeys := len(p.queues) + len(p.streams)
	if c.LeaseKey != "" {
		nkeys++
	}
	if c.PointerKey != "" {
		nkeys++
	}
	b = redisconn.AppendArrayLen(b, 1+nkeys)
	b = redisconn.AppendBulk(b, "WATCH")
	if c.LeaseKey != "" {
		b = redisconn.AppendBulk(b, c.LeaseKey)
	}
	if c.PointerKey != "" {
		b = redisconn.AppendBulk(b, c.PointerKey)
	}
	for _, k := range p.keys {
		b = redisconn.AppendBulk(b, k.meta)
	}
	for _, s := range p.streams {
		b = append(b, p.keys[s.queue].bulks[s.shard]...)
	}
	if c.LeaseKey != "" {
		b = redisconn.AppendCommand(b, "GET", c.LeaseKey)
	}
	if c.PointerKey != "" {
		b = redisconn.AppendCommand(b, "GET", c.PointerKey)
	}
	perQueue := make([]int, len(p.queues)) // streams per queue
	for _, s := range p.streams {
		perQueue[s.queue]++
	}
	for i, k := range p.keys {
		b = redisconn.AppendArrayLen(b, 4+perQueue[i])
		b = redisconn.AppendBulk(b, "HMGET")
		b = redisconn.AppendBulk(b, k.meta)
		b = redisconn.AppendBulk(b, "shards")
		b = redisconn.AppendBulk(b, "version")
		for _, s := range p.streams {
			if s.queue == i {
				b = redisconn.AppendBulk(b, k.offs[s.shard])
			}
		}
	}
	for _, s := range p.streams {
		b = redisconn.AppendArrayLen(b, 2)
		b = redisconn.AppendBulk(b, "TYPE")
		b = append(b, p.keys[s.queue].bulks[s.shard]...)
	}
	return redisconn.AppendCommand(b, "MULTI")
}

// readReads reads the replies of appendReads: the state, and the first error reply.
func (w *Writer) readReads(conn *redisconn.RawConn, p *plan, c *Cover) (*txState, error) {
	st := &txState{create: make([]bool, len(p.queues)), versions: make([]int, len(p.queues)), offs: make([]int64, len(p.streams)), streamErr: make([]error, len(p.streams))}
	var first error // the first error reply
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	layout := func(err error) {
		if st.queueErr == nil {
			st.queueErr = err
		}
	}
	rep, err := conn.Read() // WATCH
	if err != nil {
		return nil, err
	}
	keep(rep.Err())
	if c.LeaseKey != "" {
		if rep, err = conn.Read(); err != nil {
			return nil, err
		}
		keep(rep.Err())
		st.fenced = string(rep.Str) != c.Fence || rep.Nil()
	}
	if c.PointerKey != "" {
		if rep, err = conn.Read(); err != nil {
			return nil, err
		}
		keep(rep.Err())
		if rep.Kind == '$' && !rep.Nil() {
			st.stored, st.ptr = string(rep.Str), true
		}
	}
	for i, q := range p.queues {
		if rep, err = conn.Read(); err != nil {
			return nil, err
		}
		if rep.Kind != '*' {
			keep(rep.Err())
			continue
		}
		want := strconv.Itoa(p.counts[i])
		j := -1 // the stream whose off:<n> the next element is
		for k := int64(0); k < rep.Int; k++ {
			el, err := conn.Read()
			if err != nil {
				return nil, err
			}
			switch {
			case k == 0 && el.Nil():
				st.create[i] = true
			case k == 0 && string(el.Str) != want:
				layout(&errShardsChanged{meta: w.layout.Meta(q), stored: string(el.Str), given: want})
			case k == 1 && st.create[i]:
				st.versions[i] = w.conf.CreateVersion
			case k == 1 && el.Nil(): // a producer of the first layout that wrote no version
				st.versions[i] = LayoutV1
			case k == 1:
				if st.versions[i] = layoutOf(string(el.Str)); st.versions[i] == 0 {
					layout(errcode.New(errcode.LayoutVersion,
						fmt.Sprintf("queue %q has layout version %s; this pgrelay writes versions %s", q, el.Str, LayoutsText()),
						"use a pgrelay version that reads this layout, or a new queue name"))
				}
			case k >= 2:
				for j++; p.streams[j].queue != i; j++ {
				}
				if el.Nil() {
					continue
				}
				n, ok := redisconn.ParseInt(el.Str)
				if !ok || n < 0 {
					st.streamErr[j] = errcode.New(errcode.LayoutVersion,
						fmt.Sprintf("queue %q: meta field off:%d is %q, not an offset", q, p.streams[j].shard, el.Str),
						"the queue's keys were written by something other than pgrelay: use a new queue name")
				}
				st.offs[j] = n
			}
		}
	}
	for j, s := range p.streams {
		if rep, err = conn.Read(); err != nil {
			return nil, err
		}
		keep(rep.Err())
		if t := string(rep.Str); rep.Kind == '+' && t != "stream" && t != "none" && st.streamErr[j] == nil {
			st.streamErr[j] = errcode.New(errcode.LayoutVersion,
				fmt.Sprintf("queue %q: key %s is a %s, not a stream", p.queues[s.queue], w.layout.Stream(p.queues[s.queue], s.shard), t),
				"the queue's keys were written by something other than pgrelay: delete that key, or use a new queue name")
		}
	}
	st.layout = st.queueErr
	for _, err := range st.streamErr {
		if st.layout == nil {
			st.layout = err
		}
	}
	if rep, err = conn.Read(); err != nil { // MULTI
		return nil, err
	}
	keep(rep.Err())
	return st, first
}

// appendXAdds appends the XADDs of the messages in their queues' layout versions, advancing offs
// to each shard's last offset, and returns how many XADDs they are: one per message in layouts 1
// and 2; in layout 3 the messages of each shard in order, PackMessages (or PackBytes) an entry.
func (w *Writer) appendXAdds(b []byte, p *plan, msgs []Message, offs []int64, versions []int) ([]byte, int) {
	keys := make([][]byte, len(p.streams)) // each stream key, encoded (Writer.keys)
	size := 0
	for j, s := range p.streams {
		keys[j] = p.keys[s.queue].bulks[s.shard]
	}
	for i := range msgs {
		m := &msgs[i]
		size += len(keys[p.msgStream[i]]) + len(m.Partition) + len(m.ID) + len(m.Tx) + len(m.Header) + len(m.Payload) + xaddOverhead
	}
	b = slices.Grow(b, size)
	// tx and created-at usually repeat from message to message: each value's encoding (with its
	// field name) is kept and copied while it does
	var txTs []byte
	var lastTx string
	var lastTs int64
	var meta []byte // version 2: the m object, built here before its length goes out
	var enc metaEncoder
	var packed [][]int32 // version 3: per stream, its messages in order
	xadds := 0
	for i := range msgs {
		m := &msgs[i]
		j := p.msgStream[i]
		if versions[p.streams[j].queue] == LayoutV3 {
			if packed == nil {
				packed = make([][]int32, len(p.streams))
			}
			packed[j] = append(packed[j], int32(i))
			continue
		}
		offs[j]++
		xadds++
		if versions[p.streams[j].queue] == LayoutV2 {
			meta = enc.append(meta[:0], offs[j], m)
			b = append(b, xadd2Head...)
			b = append(b, keys[j]...)
			b = append(b, xadd2Meta...)
			b = redisconn.AppendBulk(b, meta)
			b = append(b, fieldD...)
			b = redisconn.AppendBulk(b, m.Payload)
			continue
		}
		b = append(b, xaddHead...)
		b = append(b, keys[j]...)
		b = append(b, xaddOff...)
		b = redisconn.AppendBulkInt(b, offs[j])
		b = append(b, fieldP...)
		b = redisconn.AppendBulk(b, m.Partition)
		b = append(b, fieldID...)
		b = redisconn.AppendBulk(b, m.ID)
		if len(txTs) == 0 || m.Tx != lastTx || m.CreatedMs != lastTs {
			lastTx, lastTs = m.Tx, m.CreatedMs
			txTs = append(txTs[:0], fieldTx...)
			txTs = redisconn.AppendBulk(txTs, m.Tx)
			txTs = append(txTs, fieldTs...)
			txTs = redisconn.AppendBulkInt(txTs, m.CreatedMs)
		}
		b = append(b, txTs...)
		if len(m.Header) == 0 {
			b = append(b, fieldNoH...)
		} else {
			b = append(b, fieldH...)
			b = redisconn.AppendBulk(b, m.Header)
		}
		b = append(b, fieldD...)
		b = redisconn.AppendBulk(b, m.Payload)
	}
	for j, idx := range packed {
		for len(idx) > 0 {
			n, size := packLen(msgs, idx)
			meta = append(meta[:0], '[')
			for k, i := range idx[:n] {
				if k > 0 {
					meta = append(meta, ',')
				}
				offs[j]++
				meta = enc.appendPacked(meta, offs[j], &msgs[i])
			}
			meta = append(meta, ']')
			b = append(b, xadd2Head...)
			b = append(b, keys[j]...)
			b = append(b, xadd2Meta...)
			b = redisconn.AppendBulk(b, meta)
			b = append(b, fieldD...)
			b = redisconn.AppendBulkHead(b, size)
			for _, i := range idx[:n] {
				b = append(b, msgs[i].Payload...)
			}
			b = append(b, "\r\n"...)
			xadds++
			idx = idx[n:]
		}
	}
	return b, xadds
}

// packLen is how many of the messages idx (of one shard, in order) the next layout-3 entry holds,
// and their payloads' size: up to PackMessages, and up to PackBytes of payloads unless the first
// alone is larger.
func packLen(msgs []Message, idx []int32) (n, size int) {
	for n < len(idx) && n < PackMessages {
		l := len(msgs[idx[n]].Payload)
		if n > 0 && size+l > PackBytes {
			break
		}
		size += l
		n++
	}
	return n, size
}

// One entry's XADD in layout version 1: `XADD <stream> * off <n> p <partition> id <id> tx <tx> ts
// <ms> h <header> d <payload>`, the seven fields of DESIGN §4 in their order; in version 2:
// `XADD <stream> * m <meta> d <payload>` (appendMeta).
const (
	xaddHead  = "*17\r\n$4\r\nXADD\r\n"
	xaddOff   = "$1\r\n*\r\n$3\r\noff\r\n"
	xadd2Head = "*7\r\n$4\r\nXADD\r\n"
	xadd2Meta = "$1\r\n*\r\n$1\r\nm\r\n"
	fieldP    = "$1\r\np\r\n"
	fieldID   = "$2\r\nid\r\n"
	fieldTx   = "$2\r\ntx\r\n"
	fieldTs   = "$2\r\nts\r\n"
	fieldH    = "$1\r\nh\r\n"
	fieldNoH  = fieldH + "$0\r\n\r\n" // h with an empty header
	fieldD    = "$1\r\nd\r\n"
	// the bytes of one XADD besides the key and the values: the constants above, six value
	// headers and two numbers of up to 20 digits (version 2's m object takes no more: its names
	// and punctuation stand in for the field names and headers it saves)
	xaddOverhead = len(xaddHead) + len(xaddOff) + len(fieldP) + len(fieldID) + len(fieldTx) + len(fieldTs) +
		len(fieldH) + len(fieldD) + 7*16 + 40
)

// exec sends b (the commands to queue after MULTI) with EXEC (and WAIT with durability replicas)
// and reads the replies: errTxConflict when EXEC aborted because a watched key changed. With pp
// it primes conn for the next write: the reads of pp (appendReads) follow in the same round trip.
//
// With open (a registered batch of a chain, its priming reads covering every shard), a batch that
// follows may queue its writes behind these commands while their replies are read (chain.go):
// the connection is then that batch's, and exec returns its outcome as a redisconn.Handed.
func (w *Writer) exec(ctx context.Context, conn *redisconn.RawConn, b []byte, queued int, pp *plan, c *Cover, open *opening) error {
	b = redisconn.AppendCommand(b, "EXEC")
	replicas := w.conf.Durability.Replicas
	if replicas > 0 {
		b = redisconn.AppendCommand(b, "WAIT", strconv.Itoa(replicas), strconv.FormatInt(w.conf.Durability.WaitTimeout.Milliseconds(), 10))
	}
	if pp != nil {
		b = w.appendReads(b, pp, c)
	}
	conn.Buf = b
	var wait time.Duration
	if replicas > 0 {
		wait = w.conf.Durability.WaitTimeout
	}
	if err := conn.Send(ctx, b, wait); err != nil {
		return err
	}
	var l *link
	if open != nil && pp != nil {
		if l = c.Chain.find(c.Pos); l != nil {
			c.Chain.opened(l, open)
		}
	}
	res, ioErr := w.execReplies(conn, queued)
	if l != nil && c.Chain.closeLink(l, ioErr == nil && res == nil) {
		if ioErr != nil {
			return redisconn.Handed{Err: ioErr}
		}
		return redisconn.Handed{Err: res}
	}
	if ioErr != nil {
		return ioErr
	}
	if pp != nil {
		// the write's outcome is res whatever these replies are: a connection whose priming
		// failed is closed instead of kept
		if st, err := w.readReads(conn, pp, c); err != nil {
			conn.Drop()
		} else {
			conn.State = &primed{leaseKey: c.LeaseKey, fence: c.Fence, pointerKey: c.PointerKey, plan: pp, st: st}
		}
	}
	return res
}

// execReplies reads the replies of the queued commands, EXEC and WAIT: the write's outcome, or
// an I/O error that left the connection out of step.
func (w *Writer) execReplies(conn *redisconn.RawConn, queued int) (res, ioErr error) {
	replicas := w.conf.Durability.Replicas
	var first error
	var rep redisconn.Reply
	var err error
	for left := queued; left > 0; left-- { // +QUEUED, or why the command was refused (READONLY, MOVED, OOM, ...)
		if left -= conn.SkipStatus("QUEUED", left); left == 0 {
			break // every +QUEUED received so far, compared in one pass
		}
		if rep, err = conn.Read(); err != nil {
			return nil, err
		}
		if first == nil {
			first = rep.Err()
		}
	}
	rep, err = conn.Read() // EXEC
	if err != nil {
		return nil, err
	}
	var aborted bool
	switch {
	case rep.Kind == '*' && rep.Nil():
		aborted = true
	case rep.Kind == '*':
		var failed error // a command that failed while EXEC ran it; the others did run
		for range rep.Int {
			if err := conn.Skip(); err != nil {
				var re redisconn.ReplyError
				if !errors.As(err, &re) {
					return nil, err
				}
				if failed == nil {
					failed = err
				}
			}
		}
		if failed != nil && first == nil {
			first = fmt.Errorf("queue write: a command failed inside EXEC, the others were applied: %w", failed)
		}
	case first == nil:
		first = rep.Err()
	}
	if replicas > 0 {
		rep, err := conn.Read()
		if err != nil {
			return nil, fmt.Errorf("WAIT %d replicas: %w", replicas, err)
		}
		if first == nil && !aborted {
			if err := rep.Err(); err != nil {
				return fmt.Errorf("WAIT %d replicas: %w", replicas, err), nil
			}
			return w.shortfall(rep.Int), nil
		}
	}
	if first != nil {
		return first, nil
	}
	if aborted {
		return errTxConflict, nil
	}
	return nil, nil
}

// discard ends the transaction and the watch on conn, which goes back to the pool, and returns
// err. (UNWATCH too: when MULTI failed, DISCARD does not end the watch.)
func (w *Writer) discard(ctx context.Context, conn *redisconn.RawConn, err error) error {
	b := redisconn.AppendCommand(conn.Buf[:0], "DISCARD")
	b = redisconn.AppendCommand(b, "UNWATCH")
	conn.Buf = b
	if e := conn.Send(ctx, b, 0); e == nil {
		_ = conn.Skip()
		_ = conn.Skip()
	}
	return err
}

// storedPos is the `pos` string of the stored pointer JSON doc; ok is false when doc is not a JSON
// object with a string member pos (the key matched as encoding/json matches a field name, the
// last one winning). Read once per batch, through jsonscan: encoding/json's reflection cost more
// than the rest of a small batch's checks.
func storedPos(doc string) (pos string, ok bool) {
	b := []byte(doc)
	err := jsonscan.Members(b, func(key []byte, _ bool, v0, v1 int) error {
		name, err := jsonscan.Text(key)
		if err != nil || !bytes.EqualFold(name, []byte("pos")) {
			return err
		}
		switch b[v0] {
		case '"':
			text, err := jsonscan.Text(b[v0:v1])
			pos, ok = string(text), err == nil
			return err
		case 'n': // null: no pos
			ok = false
			return nil
		}
		return errors.New("pos is not a string")
	})
	return pos, ok && err == nil
}

// countDown takes one from n unless it is 0: two writes at once (max_in_flight 2) that both saw
// 1 must not take it below 0, where priming would stay off for good.
func countDown(n *atomic.Int64) {
	for v := n.Load(); v > 0; v = n.Load() {
		if n.CompareAndSwap(v, v-1) {
			return
		}
	}
}
