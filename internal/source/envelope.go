package source

import (
	"encoding/json"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// Envelopes (DESIGN §2, docs/source.md "One message per transaction"): the stream changes of an
// enveloped queue go into one message per transaction, or per part of a transaction over the
// queue's limits.
//
// A part is written whole and exactly once. The changes of a transaction from the first one that
// went into a still open part up to the change where the parts close form a segment, handed to the
// bundler as one item (with the plain events of other queues among those changes), so no cover
// ever falls inside an open part: a restart resumes at a change before which every part is in the
// queue and after which none has begun. The pointer's in_txn.parts counts the parts already in, so
// the next one gets the next number. Parts close lazily, when the next change would overflow them
// (or at the commit, which marks them last), so a queue's last part usually holds events; a part
// closed because another queue's part (or the plain events among its changes) filled up, when its
// queue gets no more events in the transaction, is followed at the commit by an empty last part.

// envelopeRoom is the room kept for an envelope's head within its max_bytes.
const envelopeRoom = 256

// envelope is one enveloped queue's part of the transaction being decoded.
type envelope struct {
	cfg    *EnvelopeQueue
	events []byte // the open part's events, separated by commas
	n      int    // events in the open part
	part   uint64 // parts of the transaction closed so far
	inTxn  bool   // listed in the segment's envs
	// The events of the change being decoded begin at markLen (after markN events) when markAt is
	// that change's seq + 1.
	markAt         uint64
	markLen, markN int
}

// segment is the run of changes of the transaction being decoded since the first change that went
// into a part still open, with the enveloped queues the transaction touched.
type segment struct {
	open        bool
	touched     bool    // an envelope received an event of the change being decoded
	plain       []Event // the plain events of the segment's changes
	bytes       int     // the segment's size: plain events and envelope events
	changeBytes int     // the envelope bytes of the change being decoded
	changes     int     // changes in the segment
	lastSeq     uint64  // the seq of its last change
	envs        []*envelope
}

// newEnvelopes prepares the envelope state of every enveloped queue (nil when there is none).
func newEnvelopes(cfg *Config) map[string]*envelope {
	if len(cfg.Envelopes) == 0 {
		return nil
	}
	out := make(map[string]*envelope, len(cfg.Envelopes))
	for i := range cfg.Envelopes {
		out[cfg.Envelopes[i].Queue] = &envelope{cfg: &cfg.Envelopes[i]}
	}
	return out
}

// beginEnvelopes starts a transaction: a transaction the start pointer is inside of numbers its
// parts on from those already in the queue.
func (d *decoder) beginEnvelopes() {
	d.resetEnvelopes()
	for q, n := range d.start.Parts(d.commit) {
		if env := d.envs[q]; env != nil && n > 0 {
			env.part, env.inTxn = n, true
			d.seg.envs = append(d.seg.envs, env)
		}
	}
}

// resetEnvelopes forgets the transaction's envelopes.
func (d *decoder) resetEnvelopes() {
	s := &d.seg
	for _, env := range s.envs {
		env.events, env.n, env.part, env.inTxn, env.markAt = env.events[:0], 0, 0, false, 0
	}
	clear(s.envs)
	clear(s.plain)
	s.envs, s.plain = s.envs[:0], s.plain[:0]
	s.open, s.touched, s.bytes, s.changeBytes, s.changes = false, false, 0, 0, 0
}

// envelop appends the event of c, a change of rel (whose queue is enveloped), to its open part.
func (d *decoder) envelop(rel *relation, c *event.Change) {
	c.Position = d.pos
	c.Seq = d.seq - 1
	b := d.envStart(rel.env)
	d.envEnd(rel.env, rel.table.AppendChange(b, c))
}

// envStart returns env's events to append one more event of the change being decoded to.
func (d *decoder) envStart(env *envelope) []byte {
	if env.markAt != d.seq {
		env.markAt, env.markLen, env.markN = d.seq, len(env.events), env.n
	}
	if !env.inTxn {
		env.inTxn = true
		d.seg.envs = append(d.seg.envs, env)
	}
	d.seg.touched = true
	if len(env.events) > 0 {
		return append(env.events, ',')
	}
	return env.events
}

// envEnd takes back env's events with one more event appended.
func (d *decoder) envEnd(env *envelope, b []byte) {
	d.seg.changeBytes += len(b) - len(env.events)
	env.events = b
	env.n++
}

// emitChange hands the plain events of change seq to the bundler: as an item of their own, or,
// while the transaction has an open part (or the change opened one), into the segment.
func (d *decoder) emitChange(seq uint64, events []Event, emit func(item) error) error {
	if d.seg.open || d.seg.touched {
		return d.segmentChange(seq, events, emit)
	}
	it := item{kind: itemChange, commit: d.commit, seq: seq, events: events}
	for i := range events {
		it.size += events[i].size()
	}
	return emit(it)
}

// segmentChange adds change seq to the segment. When the segment, with it, is over a limit, the
// parts close before it: the segment's earlier changes go to the bundler as one item.
func (d *decoder) segmentChange(seq uint64, events []Event, emit func(item) error) error {
	s := &d.seg
	plainMark := len(s.plain)
	added := s.changeBytes
	for i := range events {
		added += events[i].size()
	}
	s.plain = append(s.plain, events...)
	s.open, s.touched, s.changeBytes = true, false, 0
	s.bytes += added
	s.changes++
	if s.changes > 1 && d.segmentOver(seq) {
		if err := d.closeParts(seq, plainMark, emit); err != nil {
			return err
		}
		s.bytes, s.changes = added, 1
	}
	s.lastSeq = seq
	for _, env := range s.envs {
		if env.n > 0 {
			return nil
		}
	}
	// No part is open (the change that split the segment went to no envelope): the change is an
	// ordinary one.
	it := item{kind: itemChange, commit: d.commit, seq: seq, events: d.takePlain(len(s.plain)), size: added}
	s.open, s.bytes, s.changes = false, 0, 0
	return emit(it)
}

// segmentOver reports whether the segment, with change seq, is over a limit: the bundle's (its
// plain events and envelopes must fit in one batch) or an envelope's own.
func (d *decoder) segmentOver(seq uint64) bool {
	s := &d.seg
	if len(s.plain)+len(s.envs) > d.maxMessages || s.bytes > d.maxBytes {
		return true
	}
	for _, env := range s.envs {
		if env.markAt == seq+1 && (env.n > env.cfg.MaxEvents || len(env.events)+envelopeRoom > env.cfg.MaxBytes) {
			return true
		}
	}
	return false
}

// closeParts closes every open part before change seq (whose plain events start at plainMark) and
// hands the segment's changes before it to the bundler as one item, with the part counts a
// restart inside the transaction needs. The segment keeps change seq alone.
func (d *decoder) closeParts(seq uint64, plainMark int, emit func(item) error) error {
	s := &d.seg
	closing := 0
	for _, env := range s.envs {
		if env.before(seq) > 0 {
			closing++
		}
	}
	evs := d.slab.take(plainMark + closing)
	copy(evs, s.plain[:plainMark])
	parts := make(map[string]uint64, len(s.envs))
	i := plainMark
	for _, env := range s.envs {
		if n := env.before(seq); n > 0 {
			mark := len(env.events)
			if env.markAt == seq+1 {
				mark = env.markLen
			}
			env.part++
			evs[i] = d.envelopeEvent(env, env.events[:mark], false)
			i++
			tail := env.events[mark:]
			if mark > 0 && len(tail) > 0 {
				tail = tail[1:] // the comma before the change's first event
			}
			env.events = env.events[:copy(env.events, tail)]
			env.n -= n
			env.markLen, env.markN = 0, 0
		}
		if env.part > 0 {
			parts[env.cfg.Queue] = env.part
		}
	}
	it := item{kind: itemChange, commit: d.commit, seq: s.lastSeq, events: evs, parts: parts}
	for i := range evs {
		it.size += evs[i].size()
	}
	rest := copy(s.plain, s.plain[plainMark:])
	clear(s.plain[rest:])
	s.plain = s.plain[:rest]
	return emit(it)
}

// before is how many events env's open part holds from the changes before change seq.
func (env *envelope) before(seq uint64) int {
	if env.markAt == seq+1 {
		return env.markN
	}
	return env.n
}

// finishEnvelopes closes the transaction's parts at its commit, each marked last (a queue whose
// parts all closed earlier gets an empty last part), and hands them to the bundler with the plain
// events of the segment's changes. The item comes after every change of the transaction (its seq
// is their count), so a cover after it and before the commit resumes with nothing to repeat.
func (d *decoder) finishEnvelopes(emit func(item) error) error {
	s := &d.seg
	defer d.resetEnvelopes()
	if d.start.Covered(d.commit, d.seq) {
		return nil
	}
	evs := d.slab.take(len(s.plain) + len(s.envs))
	copy(evs, s.plain)
	for i, env := range s.envs {
		env.part++
		evs[len(s.plain)+i] = d.envelopeEvent(env, env.events, true)
	}
	it := item{kind: itemChange, commit: d.commit, seq: d.seq, events: evs}
	for i := range evs {
		it.size += evs[i].size()
	}
	return emit(it)
}

// takePlain returns the segment's first n plain events in the slab and drops them from it.
func (d *decoder) takePlain(n int) []Event {
	s := &d.seg
	if n == 0 {
		return nil
	}
	evs := d.slab.take(n)
	copy(evs, s.plain[:n])
	rest := copy(s.plain, s.plain[n:])
	clear(s.plain[rest:])
	s.plain = s.plain[:rest]
	return evs
}

// envelopeEvent renders part env.part of env's envelope, holding events, as a message: its payload
// and id are copies into the arena.
func (d *decoder) envelopeEvent(env *envelope, events []byte, last bool) Event {
	h := event.Envelope{ID: d.txID, LSN: d.pos.LSN, Xid: d.pos.Xid, TS: d.pos.TS, Part: env.part, Last: last}
	d.buf = event.AppendEnvelopeHead(d.buf[:0], &h)
	head := len(d.buf)
	d.buf = pointer.AppendEnvelopeID(d.buf, d.txID, env.part)
	id := d.arena.string(d.buf[head:])
	payload := d.arena.room(head + len(events) + len(event.EnvelopeEnd))
	payload = append(payload, d.buf[:head]...)
	payload = append(payload, events...)
	payload = append(payload, event.EnvelopeEnd...)
	return Event{Queue: env.cfg.Queue, Partition: env.cfg.Partition, ID: id, Tx: d.txID, Op: event.OpEnvelope,
		LSN: d.pos.LSN, Xid: d.pos.Xid, CreatedMs: d.tsMs, Payload: payload}
}

// envelopeChunk puts the events of a snapshot chunk's parts, when their queue is enveloped, into
// envelopes: each part's events in one or more (at most env's limits), numbered across the chunk,
// the chunk's last one marked last. Their id is the chunk's tx, position its high watermark and
// read time.
func envelopeChunk(items []item, env *EnvelopeQueue, tx string, pos event.Position, ms int64) []item {
	if env == nil {
		return items
	}
	var part uint64
	var out []Event // the envelopes of the item being wrapped
	var events []byte
	n := 0
	lastItem, lastEvent := -1, -1
	for i := range items {
		if len(items[i].events) > 0 {
			lastItem = i
		}
	}
	flush := func(last bool) {
		part++
		h := event.Envelope{ID: tx, LSN: pos.LSN, TS: pos.TS, Part: part, Last: last}
		payload := event.AppendEnvelope(make([]byte, 0, len(events)+envelopeRoom), &h, events)
		out = append(out, Event{Queue: env.Queue, Partition: env.Partition, ID: pointer.EnvelopeID(tx, part), Tx: tx,
			Op: event.OpEnvelope, LSN: pos.LSN, CreatedMs: ms, Payload: payload})
		events, n = events[:0], 0
	}
	for i := range items {
		it := &items[i]
		if len(it.events) == 0 {
			continue
		}
		out = nil
		lastEvent = len(it.events) - 1
		for j := range it.events {
			p := it.events[j].Payload
			if n > 0 && (n+1 > env.MaxEvents || len(events)+1+len(p)+envelopeRoom > env.MaxBytes) {
				flush(false)
			}
			if n > 0 {
				events = append(events, ',')
			}
			events = append(events, p...)
			n++
			if j == lastEvent {
				flush(i == lastItem)
			}
		}
		it.events, it.size = out, 0
		for j := range out {
			it.size += out[j].size()
		}
	}
	return items
}

// envelopeEffects adds the effects on the table being read of the events of an envelope (the
// snapshot's window must see the stream changes inside it): sawXid reports whether the envelope
// held an event of that table, truncated whether one was a truncate.
func envelopeEffects(out []snapshot.Effect, e *Event, table string, t *snapTable) (_ []snapshot.Effect, saw, truncated bool) {
	var env struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(e.Payload, &env); err != nil {
		return out, false, false
	}
	for _, raw := range env.Events {
		var head struct {
			Op    string `json:"op"`
			Table string `json:"table"`
		}
		if json.Unmarshal(raw, &head) != nil || head.Table != table {
			continue
		}
		saw = true
		if head.Op == event.OpTruncate {
			truncated = true
			continue
		}
		inner := Event{Op: head.Op, Table: head.Table, Payload: raw}
		out = appendEffects(out, &inner, t)
	}
	return out, saw, truncated
}

// observeEnvelope is observe for an envelope of the stream (under sn.mu).
func (sn *snapshotter) observeEnvelope(e *Event) {
	t := sn.tables[sn.active]
	if t == nil || t.info.Queue != e.Queue {
		return
	}
	var saw, truncated bool
	if sn.effects, saw, truncated = envelopeEffects(sn.effects, e, sn.active, t); saw {
		sn.txXid = e.Xid
	}
	if truncated {
		sn.trunc = true
	}
}
