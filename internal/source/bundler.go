package source

import (
	"context"
	"encoding/json"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// idleWriteEvery is how often, at most, an idle pointer advance writes the pointer.
const idleWriteEvery = time.Second

// waitFor says what the bundler waits on when no batch is due.
type waitFor struct {
	ch    <-chan struct{}
	after time.Duration
}

// bundle builds the next batch from the queued items, or does an idle pointer advance, or says
// what to wait for. Only Next calls it, with no batch unacknowledged.
func (ss *session) bundle(ctx context.Context) (*Batch, waitFor, error) { return ss.build(ctx, false) }

// build is bundle; ahead (while the previous batch is still in flight) returns only a full
// batch and never writes the pointer, so nothing moves it under the batch in flight.
func (ss *session) build(ctx context.Context, ahead bool) (*Batch, waitFor, error) {
	cfg := &ss.src.cfg
	items, changed := ss.q.snapshot()
	idle := waitFor{ch: changed, after: time.Hour}
	if ss.ctx.Err() != nil {
		return nil, idle, nil
	}
	// The cover is built once at the end: per-change pointer values would cost an allocation each.
	complete, inTxn, txCommit, txDone := ss.plan.LSNValue(), ss.plan.InTxn != nil, ss.plan.CommitValue(), uint64(0)
	var txParts map[string]uint64 // envelope parts of the transaction in the queue
	if inTxn {
		txDone, txParts = ss.plan.InTxn.Done, ss.plan.InTxn.Parts
	}
	// The items are only measured here; their events are copied once a batch is due (the bundler
	// looks again on every queued change while a transaction arrives).
	var cursor json.RawMessage
	nev, size, n, full, txns, chunks := 0, 0, 0, false, 0, uint64(0)
	for ; n < len(items); n++ {
		it := &items[n]
		if it.kind == itemChange || it.kind == itemChunk {
			if nev > 0 && (nev+len(it.events) > cfg.MaxBundleMessages || size+it.size > cfg.MaxBundleBytes) {
				full = true // it starts the next batch
				break
			}
			nev += len(it.events)
			size += it.size
		}
		switch it.kind {
		case itemChange:
			if it.commit != txCommit {
				txParts = nil
			}
			if it.parts != nil {
				txParts = it.parts
			}
			inTxn, txCommit, txDone = true, it.commit, it.seq+1
		case itemCommit:
			complete, inTxn = it.commit, false
			txns++
		case itemChunk:
			if it.commit-1 > complete { // every commit before the high watermark is in
				complete = it.commit - 1
			}
			cursor = it.chunk.cursor
			chunks++
		case itemPosition:
			if !inTxn && it.lsn > complete {
				complete = it.lsn
			}
		}
	}
	partial := nev > 0 && !full && nev < cfg.MaxBundleMessages && size < cfg.MaxBundleBytes
	if partial && (ahead || inTxn) { // ahead: only a full batch; in a transaction: the rest is on its way
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
		if n == 0 || !ss.plan.Less(cover) {
			ss.q.pop(n)
			return nil, idle, nil
		}
		if chunks > 0 { // an empty chunk moves the cursor at once
			return nil, idle, ss.idleAdvance(ctx, cover, n)
		}
		if wait := time.Until(ss.lastIdleWrite.Add(idleWriteEvery)); wait > 0 {
			return nil, waitFor{ch: changed, after: wait}, nil
		}
		return nil, idle, ss.idleAdvance(ctx, cover, n)
	}
	if partial {
		if ss.firstSeen.IsZero() {
			ss.firstSeen = time.Now()
		}
		if wait := time.Until(ss.firstSeen.Add(cfg.Linger)); wait > 0 {
			return nil, waitFor{ch: changed, after: wait}, nil
		}
	}
	events := make([]Event, 0, nev)
	for i := range items[:n] {
		events = append(events, items[i].events...)
	}
	ss.q.pop(n)
	ss.plan = cover
	ss.firstSeen = time.Time{}
	return &Batch{Events: events, Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease,
		Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss, txns: txns}, idle, nil
}

// idleAdvance moves the pointer over items without events (idle WAL, empty transactions).
func (ss *session) idleAdvance(ctx context.Context, cover pointer.Pointer, n int) error {
	b := &Batch{Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease, Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss}
	ss.lastIdleWrite = time.Now()
	if _, err := ss.src.writer.Write(ctx, nil, b.cover()); err != nil {
		if errcode.Is(err, errcode.Fenced) {
			return err
		}
		ss.src.log.Warnf("pg_cdc %s: idle pointer advance: %v", ss.src.cfg.Name, err)
		return nil
	}
	ss.q.pop(n)
	ss.plan = cover
	ss.acked(b)
	return nil
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
		if h.Messages != nil {
			h.Messages(int64(len(b.Events)))
		}
		if h.Bundles != nil {
			h.Bundles(1)
		}
	}
}
