package source

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/pointer"
)

// idleWriteEvery is how often, at most, an idle pointer advance writes the pointer.
const idleWriteEvery = time.Second

// waitFor says what the bundler waits on when no batch is due.
type waitFor struct {
	ch    <-chan struct{}
	ready <-chan struct{} // also ends the wait (nil: none)
	after time.Duration
}

// bundle builds the next batch from the queued items, or does an idle pointer advance, or says
// what to wait for. Only Next calls it, with no batch unacknowledged.
func (ss *session) bundle(ctx context.Context) (*Batch, waitFor, error) { return ss.build(ctx, false) }

// build is bundle; ahead (while the previous batch is still in flight) returns only a full
// batch and never writes the pointer, so nothing moves it under the batch in flight.
func (ss *session) build(ctx context.Context, ahead bool) (*Batch, waitFor, error) {
	cfg := &ss.src.cfg
	items, changed := ss.q.peek()
	idle := waitFor{ch: changed, after: time.Hour}
	if ss.ctx.Err() != nil {
		return nil, idle, nil
	}
	// The items are only measured here; their events are copied once a batch is due. The bundler
	// looks again on every queued change while a transaction arrives, so the measure goes on from
	// where the last look stopped (ss.scan, until the next pop): measured from the first item each
	// time, a transaction of n changes cost n²/2 item visits.
	st := &ss.scan
	if !st.valid {
		// The cover is built once at the end: per-change pointer values would cost an allocation each.
		*st = scan{valid: true, complete: ss.plan.LSNValue(), inTxn: ss.plan.InTxn != nil, txCommit: ss.plan.CommitValue()}
		if st.inTxn {
			st.txDone, st.txParts = ss.plan.InTxn.Done, ss.plan.InTxn.Parts
		}
	}
	for ; !st.full && st.n < len(items); st.n++ {
		it := &items[st.n]
		if it.kind == itemChange || it.kind == itemChunk {
			if st.nev > 0 && (st.nev+len(it.events) > cfg.MaxBundleMessages || st.size+it.size > cfg.MaxBundleBytes) {
				st.full = true // it starts the next batch
				break
			}
			st.nev += len(it.events)
			st.size += it.size
		}
		switch it.kind {
		case itemChange:
			if it.commit != st.txCommit {
				st.txParts = nil
			}
			if it.parts != nil {
				st.txParts = it.parts
			}
			st.inTxn, st.txCommit, st.txDone = true, it.commit, it.seq+1
		case itemCommit:
			st.complete, st.inTxn, st.behind = it.commit, false, it.behind
			st.txns++
		case itemChunk:
			if it.commit-1 > st.complete { // every commit before the high watermark is in
				st.complete = it.commit - 1
			}
			st.cursor = it.chunk.cursor
			st.chunks++
		case itemPosition:
			if !st.inTxn && it.lsn > st.complete {
				st.complete = it.lsn
			}
		}
	}
	n, nev, size, full, txns, chunks, behind := st.n, st.nev, st.size, st.full, st.txns, st.chunks, st.behind
	complete, inTxn, txCommit, txDone, txParts, cursor := st.complete, st.inTxn, st.txCommit, st.txDone, st.txParts, st.cursor
	partial := nev > 0 && !full && nev < cfg.MaxBundleMessages && size < cfg.MaxBundleBytes
	if partial && (ahead || inTxn) { // ahead: only a full batch; in a transaction: the rest is on its way
		if !ahead {
			ss.askData()
		}
		return nil, idle, nil
	}
	cover := ss.plan.AtCommit(complete)
	if inTxn {
		cover = cover.InsideTxn(txCommit, txDone).WithParts(txParts)
	}
	if chunks > 0 {
		cover.Snapshot, cover.SnapshotChunks = cursor, cover.SnapshotChunks+chunks
	}
	if nev == 0 {
		if ahead {
			return nil, idle, nil
		}
		// Under load the next batch waits to fill anyway: the reader reads in its turn before
		// then, not at once; once that turn is read in (and brought nothing to send), now.
		fill := ss.fillUntil(false)
		if turn := ss.turnBefore(fill, turnHeadStart); ss.turnAhead(fill) && ss.readServed.Load() != turn {
			ss.giveTurn(turn)
			idle.ready = ss.readDone // the turn read in: look again (it may have brought only part of a message)
		} else {
			ss.askData()
		}
		if n == 0 || !ss.plan.Less(cover) {
			ss.pop(n)
			return nil, idle, nil
		}
		if chunks > 0 { // an empty chunk moves the cursor at once
			ss.idleAdvance(cover, n)
			return nil, idle, nil
		}
		if wait := time.Until(ss.lastIdleWrite.Add(idleWriteEvery)); wait > 0 {
			return nil, waitFor{ch: changed, after: wait}, nil
		}
		ss.idleAdvance(cover, n)
		return nil, idle, nil
	}
	if partial {
		if ss.firstSeen.IsZero() {
			ss.firstSeen = time.Now()
		}
		until := ss.firstSeen.Add(cfg.Linger)
		fill := ss.fillUntil(behind)
		ss.coalesce.setLoaded(!fill.IsZero())
		if fill.After(until) {
			until = fill
		}
		var ready <-chan struct{}
		switch {
		case fill.IsZero() || !until.After(time.Now()): // no wait to fill, or due now
			ss.askData() // (a reader still waiting for a turn reads now)
		case ss.turnAhead(until):
			// The reader leaves the WAL unread until its turn shortly before the batch goes: what
			// arrives meanwhile is then read in a few large reads instead of one read per message
			// as it comes. Once that read is queued the batch goes (coalesce.go, readTurn); the
			// wait's own end is then only for a reader that could not read (nothing arrived).
			turn := ss.turnBefore(until, turnHeadStart)
			ss.giveTurn(turn)
			if ss.readServed.Load() == turn {
				until = time.Time{}
			} else {
				ready, until = ss.readDone, until.Add(cfg.LoadLinger/turnHeadStart)
			}
		case until.Equal(fill): // behind, a snapshot, or a long load_linger: the reader pauses until shortly before
			ss.giveTurn(ss.turnBefore(until, readHeadStart))
		}
		if wait := time.Until(until); wait > 0 {
			// Only a full batch (or the reader's turn served) ends the wait early: waking on
			// every queued change would cost a wake-up per change.
			return nil, waitFor{ch: ss.q.whenFull(), ready: ready, after: wait}, nil
		}
	}
	ss.wantData.Store(false)
	events := soleEvents(items[:n])
	if events == nil {
		events = make([]Event, 0, nev)
		for i := range items[:n] {
			events = append(events, items[i].events...)
		}
	}
	ss.pop(n)
	ss.plan = cover
	ss.firstSeen = time.Time{}
	ss.measure(nev, time.Now())
	return &Batch{Events: events, Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease,
		Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss, txns: txns}, idle, nil
}

// Under sustained load a batch that is not full waits a little to fill (load_linger): with one
// batch in flight it would otherwise hold only what arrived during the previous write, and every
// batch costs the same fixed work whatever its size (the output's write, with durability aof an
// fsync; the pipeline's hand-overs; the ack).
const (
	// FillMinEvents: a batch waits only when the wait is expected to bring at least this many
	// events (the arrival rate times load_linger), so a slow trickle never waits.
	FillMinEvents = 8
	// readHeadStart: during a wait to fill, the reader resumes reading this fraction of
	// load_linger before the batch goes, to have read and queued what arrived meanwhile.
	readHeadStart = 4
	// turnHeadStart: the same when the reader reads in turns (coalesce.go, readTurn): the batch
	// goes as soon as the turn's read is queued, so the turn comes later.
	turnHeadStart = 8
	// rateWeight is the weight of the newest batch in the arrival rate's averages.
	rateWeight = 1.0 / 8
	// maxRateGap bounds one gap between batches in the average, so the rate recovers within a few
	// batches after an idle spell.
	maxRateGap = 100 * time.Millisecond
)

// fillUntil is when a batch that is not full may go under sustained load: load_linger after the
// previous batch's ack, if events arrive fast enough that the wait brings at least FillMinEvents
// more, or if the newest transaction queued arrived with the stream behind the writers (behind:
// more WAL is certainly waiting, whatever the rate it arrives at); otherwise the zero time (no wait).
func (ss *session) fillUntil(behind bool) time.Time {
	if ss.src.cfg.LoadLinger <= 0 || !behind && !ss.underLoad() {
		return time.Time{}
	}
	return time.Unix(0, ss.lastAck.Load()).Add(ss.src.cfg.LoadLinger)
}

// underLoad reports whether events arrive fast enough that a batch waits to fill: the wait of
// load_linger is expected to bring at least FillMinEvents.
func (ss *session) underLoad() bool {
	wait := ss.src.cfg.LoadLinger
	return wait > 0 && ss.gapAvg > 0 && ss.evAvg/ss.gapAvg*wait.Seconds() >= FillMinEvents
}

// measure adds a batch of nev events built now to the arrival rate: the average events per
// batch over the average time between batches (a ratio of averages, so one batch after a
// short gap does not make a trickle look like a flood).
func (ss *session) measure(nev int, now time.Time) {
	if !ss.lastCut.IsZero() {
		gap := max(min(now.Sub(ss.lastCut), maxRateGap), 0).Seconds()
		ss.evAvg += (float64(nev) - ss.evAvg) * rateWeight
		ss.gapAvg += (gap - ss.gapAvg) * rateWeight
	}
	ss.lastCut = now
}

// scan is build's measure of the queued items, items[:n]: what a batch of them would hold and
// cover. It stays valid while the queue's head does (pushes only append).
type scan struct {
	valid              bool
	n, nev, size, txns int
	chunks             uint64
	full, inTxn        bool
	behind             bool // the newest transaction measured arrived with the stream behind
	complete, txCommit pglogrepl.LSN
	txDone             uint64
	txParts            map[string]uint64 // envelope parts of the transaction in the queue
	cursor             json.RawMessage
}

// soleEvents is the events of the one item of items that has any (a snapshot chunk's part is a
// whole batch): the batch takes them as they are instead of a copy. nil when more than one item,
// or none, has events.
func soleEvents(items []item) []Event {
	var out []Event
	for i := range items {
		if len(items[i].events) > 0 {
			if out != nil {
				return nil
			}
			out = items[i].events
		}
	}
	return out
}

// turnBefore is the reader's turn (the end of its pause, unix ns) for a batch that goes at at:
// load_linger / headStart before it.
func (ss *session) turnBefore(at time.Time, headStart time.Duration) int64 {
	return at.Add(-ss.src.cfg.LoadLinger / headStart).UnixNano()
}

// turnAhead reports whether a batch that goes at at is one the reader gets a turn for: the reader
// reads in turns, and at is ahead, within a turn's longest wait.
func (ss *session) turnAhead(at time.Time) bool {
	d := time.Until(at)
	return d > 0 && d <= turnWaitMax && ss.turns()
}

// giveTurn gives the reader its next turn (a reader waiting between turns takes it).
func (ss *session) giveTurn(turn int64) {
	ss.wantData.Store(false)
	if ss.readPause.Load() != turn {
		ss.readPause.Store(turn)
		poke(ss.readWake)
	}
}

// askData tells a reader waiting for its turn that the bundler has nothing to send: read now.
func (ss *session) askData() {
	if !ss.wantData.Load() {
		ss.wantData.Store(true)
		poke(ss.readWake)
	}
}

// pop removes the first n queued items; build measures the rest from the start again.
func (ss *session) pop(n int) {
	ss.q.pop(n)
	if n > 0 {
		ss.scan = scan{}
	}
}

// idleAdvance moves the pointer over items without events (idle WAL, empty transactions): the
// cover goes to the cover writer like an acknowledged batch's, behind the covers before it.
func (ss *session) idleAdvance(cover pointer.Pointer, n int) {
	b := &Batch{Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease, Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss}
	ss.lastIdleWrite = time.Now()
	ss.pop(n)
	ss.plan = cover
	ss.src.covers.add(b)
}

// acked records that b's cover is durably the pointer: PostgreSQL may now drop the WAL before it.
func (ss *session) acked(b *Batch) {
	ss.flush.Store(uint64(b.Cover.LSNValue()))
	if ss.snap != nil {
		ss.snap.ackedCover(b.Cover.SnapshotChunks)
	}
	h := ss.src.hooks
	if h.PointerLSN != nil {
		h.PointerLSN(uint64(b.Cover.LSNValue()))
	}
	if h.Transactions != nil && b.txns > 0 {
		h.Transactions(int64(b.txns))
	}
	if len(b.Events) > 0 {
		ss.lastAck.Store(time.Now().UnixNano())
		if h.Messages != nil {
			h.Messages(int64(len(b.Events)))
		}
		if h.Bundles != nil {
			h.Bundles(1)
		}
	}
}
