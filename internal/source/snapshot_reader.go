package source

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// waitAcked blocks until the acknowledged pointer counts target chunk parts.
func (sn *snapshotter) waitAcked(ctx context.Context, target uint64) error {
	for sn.acked.Load() < target {
		select {
		case <-sn.ackSignal:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// ackedCover records an acknowledged cover (called by session.acked): the pointer counts its
// chunk parts.
func (sn *snapshotter) ackedCover(chunks uint64) {
	if chunks > sn.acked.Load() {
		sn.acked.Store(chunks)
		select {
		case sn.ackSignal <- struct{}{}:
		default:
		}
	}
	sn.delivered(chunks)
}

// delivered records that the output acknowledged a batch counting chunks parts: the chunks it
// completes leave the share's pipeline (their pointer write, when pg_cdc makes it, goes on in
// the background).
func (sn *snapshotter) delivered(chunks uint64) {
	sn.mu.Lock()
	written := sn.share.written(chunks)
	sn.mu.Unlock()
	if written {
		sn.signalTurn()
	}
}

// observe collects the effects of stream changes on the table being read, and counts the stream's
// bytes for the share (reader goroutine).
func (sn *snapshotter) observe(it item) {
	if sn.over.Load() {
		return
	}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	switch it.kind {
	case itemChange:
		if sn.share.streamed(it.size) {
			sn.signalTurn()
		}
		for i := range it.events {
			e := &it.events[i]
			sn.txXid = e.Xid
			if e.Op == event.OpEnvelope {
				sn.txOther = true
				sn.observeEnvelope(e)
				continue
			}
			if e.Table != sn.active {
				sn.txOther = true
				continue
			}
			if e.Op == event.OpTruncate {
				sn.trunc = true
				continue
			}
			sn.effects = appendEffects(sn.effects, e, sn.tables[sn.active])
		}
	case itemCommit:
		if len(sn.effects) > 0 || sn.trunc {
			c := snapshot.Commit{Xid: sn.txXid, Effects: sn.effects, Truncate: sn.trunc}
			for _, p := range sn.pending {
				p.win.Observe(c)
			}
			sn.history = append(sn.history, c)
		}
		if sn.txOther {
			sn.decoded = append(sn.decoded, sn.txXid)
		}
		sn.effects, sn.trunc, sn.txOther = nil, false, false
	}
}

// appendEffects turns one stream event into the effects the window needs. A key change under
// partition_by single (a u whose before holds another key) deletes the old key.
func appendEffects(out []snapshot.Effect, e *Event, t *snapTable) []snapshot.Effect {
	var ev struct {
		Key       json.RawMessage            `json:"key"`
		Before    map[string]json.RawMessage `json:"before"`
		Unchanged []string                   `json:"unchanged"`
	}
	if err := json.Unmarshal(e.Payload, &ev); err != nil {
		return out
	}
	key := string(ev.Key)
	switch e.Op {
	case event.OpInsert:
		if len(ev.Unchanged) > 0 { // a key change whose read-back found nothing: not every column is carried
			return append(out, snapshot.Effect{Key: key, Unchanged: ev.Unchanged})
		}
		return append(out, snapshot.Effect{Key: key, Put: true})
	case event.OpDelete:
		return append(out, snapshot.Effect{Key: key, Delete: true})
	case event.OpUpdate:
		if ev.Before != nil && t != nil {
			b := []byte{'{'}
			for i, k := range t.info.Key {
				if i > 0 {
					b = append(b, ',')
				}
				b = convert.AppendString(b, []byte(k))
				b = append(b, ':')
				b = append(b, ev.Before[k]...)
			}
			if old := string(append(b, '}')); old != key {
				out = append(out, snapshot.Effect{Key: old, Delete: true})
			}
		}
		return append(out, snapshot.Effect{Key: key, Unchanged: ev.Unchanged})
	}
	return out
}

// lowWatermark marks the window of the chunk with this id (reader goroutine).
func (sn *snapshotter) lowWatermark(id string) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	for _, p := range sn.pending {
		if p.id == id {
			p.win.LowWatermark()
		}
	}
}

// highWatermark resolves the chunk with this id and hands its parts to the bundler (reader
// goroutine). It reports false for an unknown watermark (an earlier life's). The watermarks of
// this life come in the order they were emitted, so the chunk is the first pending one.
func (sn *snapshotter) highWatermark(id string, hw pglogrepl.LSN, emit func(item) error) (bool, error) {
	sn.mu.Lock()
	i := slices.IndexFunc(sn.pending, func(p *pendingChunk) bool { return p.id == id })
	if i < 0 {
		sn.mu.Unlock()
		return false, nil
	}
	p := sn.pending[i]
	if i > 0 || !p.win.Seen() {
		sn.mu.Unlock()
		return true, fmt.Errorf("snapshot chunk %s: high watermark at %s out of order", id, hw)
	}
	sn.pending = slices.Delete(sn.pending, 0, 1)
	sn.share.reached()
	sn.mu.Unlock()
	sn.signalTurn()
	if p.ready != nil { // the round trip that emitted the watermark may still be receiving the chunk's rows
		select {
		case <-p.ready:
		case <-sn.ss.ctx.Done():
			return true, sn.ss.ctx.Err()
		}
	}
	return true, sn.deliver(p, hw, hw, emit)
}

// earlyDistance: a chunk whose rows are all older than the stream's position (pendingChunk.early)
// goes into the item queue where the stream is, ahead of its high watermark, when the stream still
// has to pass more than this many times the chunk's own bytes of WAL to reach that watermark: the
// stream is working off a backlog, which the chunk would otherwise wait behind. A stream that keeps
// up reaches the watermark within a few chunks' worth of WAL, and its chunks go there as before.
const earlyDistance = 8

// behind reports whether the next chunk should read its rows' xmin, which costs the chunk reader
// and pgrelay a column more per row: when the stream was far behind the last chunk's high
// watermark at the reader's last look (as early requires), and for a session's first chunk, which
// holds the later ones back if it may not go early (run's goroutine).
func (sn *snapshotter) behind() bool {
	if sn.lastHW == 0 {
		return true
	}
	at := pglogrepl.LSN(sn.streamAt.Load())
	sn.mu.Lock()
	last := sn.share.last
	sn.mu.Unlock()
	return far(sn.lastHW, at, last)
}

// far reports whether a stream at at still has more than earlyDistance times size bytes of WAL
// to pass before hw.
func far(hw, at pglogrepl.LSN, size int) bool {
	return hw > at && uint64(hw-at) > uint64(earlyDistance*max(size, 1))
}

// early hands the first pending chunk over at the stream's position at (reader goroutine, between
// transactions) when it is ready, early, and far enough ahead of the stream (earlyDistance). Its
// rows as read are what the stream gives at at: each was last written by a transaction that ended
// before the slot's confirmed position when the chunk was read, which is at or before at, and a
// commit after at follows the chunk in the queue, also one written before the read that the read
// did not see (a synchronous standby holding it). Commits already decoded that the chunk's snapshot
// did not see drop their rows as at the high watermark. Its events get their lsn there
// (pendingChunk.lsn, retail). Chunks go in order: the first pending one only.
func (sn *snapshotter) early(at pglogrepl.LSN, emit func(item) error) error {
	if at == 0 {
		return nil
	}
	sn.streamAt.Store(uint64(at))
	sn.mu.Lock()
	if len(sn.pending) == 0 {
		sn.mu.Unlock()
		return nil
	}
	p := sn.pending[0]
	select {
	case <-p.ready:
	default:
		sn.mu.Unlock()
		return nil
	}
	if !p.early || !far(p.hwAt, at, p.size) {
		sn.mu.Unlock()
		return nil
	}
	sn.pending = slices.Delete(sn.pending, 0, 1)
	sn.share.reached()
	sn.mu.Unlock()
	sn.signalTurn()
	p.wentEarly, p.wentAt = true, at+1
	return sn.deliver(p, p.hwAt, p.wentAt, emit)
}

// deliver builds the parts of p (ready, and out of the pending chunks) for its high watermark hw and
// pushes them into the item queue at commit (hw, or the stream's position + 1 for an early chunk):
// the cover of a part holds every commit before that (reader goroutine).
func (sn *snapshotter) deliver(p *pendingChunk, hw, commit pglogrepl.LSN, emit func(item) error) error {
	sn.mu.Lock()
	kept := sn.history[:0]
	for _, c := range sn.history { // a commit this chunk's snapshot saw is seen by every later one
		if !p.chunk.Snapshot.Sees(c.Xid) {
			kept = append(kept, c)
		}
	}
	sn.history = kept
	sn.decoded = slices.DeleteFunc(sn.decoded, p.chunk.Snapshot.Sees)
	sn.mu.Unlock()
	items, err := sn.build(p, hw)
	if err != nil {
		return err
	}
	if p.over { // no chunk comes after the last: stop keeping the stream's commits for one
		sn.setActive("")
		sn.over.Store(true)
	}
	for _, it := range items {
		it.commit = commit
		if err := emit(it); err != nil {
			return err
		}
	}
	p.parts = len(items)
	sn.pushed.Add(uint64(len(items)))
	close(p.done)
	sn.handOver(p)
	// The chunk's values are no longer used (its events, keys and cursors are copies): the next
	// read may reuse their memory.
	if b := p.chunk.Buffers; b != nil {
		select {
		case sn.bufs <- b:
		default:
		}
	}
	return nil
}

// handOver records that the reader pushed p's parts: the share may let the next chunk go.
func (sn *snapshotter) handOver(p *pendingChunk) {
	sn.mu.Lock()
	sn.share.handed(p.readSize+p.size, sn.startS+sn.pushed.Load())
	sn.mu.Unlock()
	sn.signalTurn()
	src := sn.ss.src
	if h := src.hooks.SnapshotRows; h != nil {
		h(int64(p.chunk.Rows.Len()))
	}
	if h := src.hooks.SnapshotTables; h != nil && (p.next.Table != p.cursor.Table || p.over) {
		h(1)
	}
}

func (sn *snapshotter) signalTurn() {
	select {
	case sn.turn <- struct{}{}:
	default:
	}
}

// watermarkID splits a watermark's content "<life>:<n>:<lw|hw>".
func watermarkID(content []byte) (id, kind string, ok bool) {
	s := string(content)
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// watermark handles a message with the watermark prefix (reader goroutine); handled is true when
// it was this life's high watermark and the chunk's parts were pushed (they carry the position).
func (ss *session) watermark(lm *pglogrepl.LogicalDecodingMessage, emit func(item) error) (bool, error) {
	id, kind, ok := watermarkID(lm.Content)
	if !ok {
		return false, nil
	}
	switch kind {
	case "lw":
		ss.snap.lowWatermark(id)
	case "hw":
		return ss.snap.highWatermark(id, lm.LSN, emit)
	}
	return false, nil
}
