package source

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// render renders every row of p's chunk as an `r` event for the high watermark at hw (lsn), into an
// arena of its own (it runs on a goroutine of its own).
func (sn *snapshotter) render(p *pendingChunk, hw pglogrepl.LSN) ([]Event, int) {
	t, ch := p.table, p.chunk
	if t == nil || ch.Rows.Len() == 0 {
		return nil, 0
	}
	tx, pos, ms := sn.tx(hw), sn.position(p.lsn(hw), ch), ch.ReadAt.UnixMilli()
	events := make([]Event, ch.Rows.Len())
	var a arena
	var buf []byte
	var row event.Row
	size := 0
	for i, r := range ch.Rows.All() {
		row = event.TextRow(row, r)
		pos.Seq = uint64(i)
		events[i] = t.readEvent(&a, &buf, row, &pos, tx, ms)
		size += events[i].size()
	}
	return events, size
}

// retail rewrites, in place, p's events rendered with lsn from in their tails for lsn to instead (a
// chunk that went ahead of the stream: pendingChunk.lsn): each payload's body is copied, not rendered
// again from the row's values, and its tail written anew; id and partition stay (the transaction id
// is the high watermark's either way).
func (sn *snapshotter) retail(p *pendingChunk, events []Event, from, to pglogrepl.LSN) []Event {
	old, pos := sn.position(from, p.chunk), sn.position(to, p.chunk)
	var a arena
	var tail []byte
	for i := range events {
		e := &events[i]
		old.Seq, pos.Seq = uint64(i), uint64(i)
		tail = event.AppendTail(tail[:0], &old)
		body := e.Payload[:len(e.Payload)-len(tail)]
		tail = event.AppendTail(tail[:0], &pos)
		b := a.room(len(body) + len(tail))
		b = append(append(b, body...), tail...)
		e.Payload, e.LSN = b[:len(b):len(b)], pos.LSN
	}
	return events
}

// tx is the transaction id of a chunk's events (§3): the chunk's high watermark.
func (sn *snapshotter) tx(hw pglogrepl.LSN) string {
	return fmt.Sprintf("pg:%s:s:%016X", sn.epoch, uint64(hw))
}

// position is the tail of a chunk's events but their seq: their lsn (the chunk's high watermark, or
// where it went ahead: pendingChunk.lsn) and the read time.
func (sn *snapshotter) position(lsn pglogrepl.LSN, ch *snapshot.Chunk) event.Position {
	return event.Position{LSN: lsn.String(), TS: ch.ReadAt.Format(event.TimeFormat)}
}

// rowRender renders a chunk's rows as `r` events while the round trip receives them, each up to
// its tail: the tail holds the high watermark's LSN and the read time, known once the round trip
// ends, when finish completes the events. The server prints the next rows meanwhile.
type rowRender struct {
	t        *snapTable
	bodies   []byte // the rows' events up to their tails, back to back
	ends     []int  // per row, the end of its body in bodies
	parts    []byte // the rows' partition names, back to back (a table partitioned by columns)
	partEnds []int
	row      event.Row
	change   event.Change
	buf      []byte // finish's
}

// reset prepares r for a chunk of t, keeping its buffers.
func (r *rowRender) reset(t *snapTable) {
	r.t, r.bodies, r.ends, r.parts, r.partEnds = t, r.bodies[:0], r.ends[:0], r.parts[:0], r.partEnds[:0]
	r.change = event.Change{Op: event.OpRead}
}

// add renders the next row of the chunk (output-function text, nil = NULL) up to its tail.
func (r *rowRender) add(vals [][]byte) {
	r.row = event.TextRow(r.row, vals)
	r.change.Row = r.row
	r.bodies = r.t.enc.AppendChangeBody(r.bodies, &r.change)
	r.ends = append(r.ends, len(r.bodies))
	if r.t.enc.Part != nil {
		r.parts = r.t.enc.AppendPartition(r.parts, r.row)
		r.partEnds = append(r.partEnds, len(r.parts))
	}
}

// finish completes the rendered rows as the events render would make for the same tail, into an
// arena of their own, and returns them with their size.
func (r *rowRender) finish(tx string, pos event.Position, ms int64) ([]Event, int) {
	t := r.t
	events := make([]Event, len(r.ends))
	var a arena
	pos.Seq = 0
	tail := len(event.AppendTail(r.buf[:0], &pos)) - 1 // the tail's length but its seq's digits
	size, from, partFrom := 0, 0, 0
	for i, end := range r.ends {
		pos.Seq = uint64(i)
		var part []byte
		if t.enc.Part != nil {
			part = r.parts[partFrom:r.partEnds[i]]
			partFrom = r.partEnds[i]
		}
		// Completed in place in the arena (its exact size is known): payload, id, partition.
		digits := decimalDigits(pos.Seq)
		b := a.room(end - from + tail + digits + len(tx) + 1 + digits + len(part))
		b = append(b, r.bodies[from:end]...)
		from = end
		b = event.AppendTail(b, &pos)
		n := len(b)
		b, idEnd := t.appendID(b, nil, part, pos.Seq, tx, "")
		events[i] = t.eventOf(b, n, idEnd, event.OpRead, pos.LSN, tx, ms)
		size += events[i].size()
	}
	return events, size
}

// decimalDigits is the number of digits of v in decimal.
func decimalDigits(v uint64) int {
	n := 1
	for ; v >= 10; v /= 10 {
		n++
	}
	return n
}

// build applies the DBLog rule to the chunk and gives its survivors (r) and fills (u) in row
// order, split into bundle-sized parts, each carrying the cursor after its last row. The `r`
// events are those rendered ahead for this high watermark (with their lsn rewritten for a chunk
// that went ahead of the stream: where it went), or rendered now.
func (sn *snapshotter) build(p *pendingChunk, hw pglogrepl.LSN) ([]item, error) {
	t, ch := p.table, p.chunk
	next, over := p.cursor.Advance(ch.Rows.Len(), ch.LastKey, ch.Limit)
	if p.ready == nil { // not prepared (and so not read by run)
		p.next, p.over = next, over
	}
	events := p.events
	switch {
	case len(events) != ch.Rows.Len() || p.hwAt != hw:
		events, _ = sn.render(p, hw)
	case p.wentEarly: // rendered for the high watermark before the chunk went ahead
		events = sn.retail(p, events, hw, p.lsn(hw))
	}
	var kind []byte // per row: 0 dropped, 'r' survivor, 'f' fill; nil: every row survives
	var fillCols map[int][]string
	if t != nil && p.win.Drops(ch.Snapshot) {
		rows := make([]snapshot.Row, ch.Rows.Len())
		index := make(map[string]int, ch.Rows.Len())
		var row event.Row
		var buf []byte
		for i, r := range ch.Rows.All() {
			row = event.TextRow(row, r)
			buf = t.enc.AppendKey(buf[:0], row)
			rows[i].Key = sn.arena.string(buf)
			index[rows[i].Key] = i
		}
		survivors, fills := p.win.Resolve(rows, ch.Snapshot, t.nonKey)
		kind = make([]byte, ch.Rows.Len())
		fillCols = make(map[int][]string, len(fills))
		for _, r := range survivors {
			kind[index[r.Key]] = 'r'
		}
		for _, f := range fills {
			i := index[f.Row.Key]
			kind[i], fillCols[i] = 'f', f.Columns
		}
	}
	tx, pos, ms := sn.tx(hw), sn.position(p.lsn(hw), ch), ch.ReadAt.UnixMilli() // fills (and an envelope, never early)
	var buf []byte
	var row event.Row
	cfg := &sn.ss.src.cfg
	var out []item
	cur := item{kind: itemChunk, commit: hw}
	from := 0 // while every row survives, the part is events[from:i]
	flush := func(lastRow int, final bool) {
		part := &chunkPart{}
		if final {
			part.rows = ch.Rows.Len()
			if over {
				part.cursor = json.RawMessage("null")
			} else {
				part.cursor, _ = json.Marshal(next)
				part.next = next.Table
			}
		} else {
			mid := p.cursor
			mid.After = t.keyText(&ch.Rows, lastRow)
			mid.Rows = p.cursor.Rows + int64(lastRow+1)
			part.cursor, _ = json.Marshal(mid)
			part.next, part.rows = mid.Table, lastRow+1
		}
		if kind == nil && lastRow >= from {
			cur.events = events[from : lastRow+1 : lastRow+1]
			from = lastRow + 1
		}
		cur.chunk = part
		out = append(out, cur)
		cur = item{kind: itemChunk, commit: hw}
	}
	n := 0 // events in the part being built
	var vals [][]byte
	for i := range ch.Rows.Len() {
		if kind != nil && kind[i] == 0 {
			continue
		}
		ev := &events[i]
		var fill Event
		if kind != nil && kind[i] == 'f' {
			vals = ch.Rows.Row(i, vals)
			row = event.TextRow(row, vals)
			pos.Seq = uint64(i)
			fill = t.fillEvent(&sn.arena, &buf, row, fillCols[i], &pos, tx, ms)
			ev = &fill
		}
		if n > 0 && (n+1 > cfg.MaxBundleMessages || cur.size+ev.size() > cfg.MaxBundleBytes) {
			flush(i-1, false)
			n = 0
		}
		if kind != nil {
			cur.events = append(cur.events, *ev)
		}
		n++
		cur.size += ev.size()
	}
	flush(ch.Rows.Len()-1, true)
	if t != nil {
		out = envelopeChunk(out, cfg.Envelope(t.info.Queue), tx, pos, ms)
	}
	return out, nil
}

// keyText is the cursor form of row i's key: the key values as printed.
func (t *snapTable) keyText(rows *snapshot.Rows, i int) []string {
	out := make([]string, len(t.enc.Key))
	for k, j := range t.enc.Key {
		out[k] = string(rows.Value(i, j))
	}
	return out
}

// readEvent renders a surviving row as an `r` event (DESIGN §2: no xid, lsn = high watermark),
// encoding into *buf; its bytes go to a.
func (t *snapTable) readEvent(a *arena, buf *[]byte, row event.Row, pos *event.Position, tx string, ms int64) Event {
	return t.event(a, buf, &event.Change{Op: event.OpRead, Row: row, Position: *pos}, tx, "", ms)
}

// fillEvent renders a fill: a `u` whose after holds the key and the restored columns, every other
// column unchanged.
func (t *snapTable) fillEvent(a *arena, buf *[]byte, row event.Row, restore []string, pos *event.Position, tx string, ms int64) Event {
	for i, c := range t.spec.Columns {
		if !t.isKey[i] && !slices.Contains(restore, c.Name) {
			row[i] = event.Value{Kind: event.Unchanged}
		}
	}
	return t.event(a, buf, &event.Change{Op: event.OpUpdate, Row: row, Position: *pos}, tx, "f", ms)
}

// event renders c; its payload, id and partition name are one copy into a.
func (t *snapTable) event(a *arena, buf *[]byte, c *event.Change, tx, idTag string, ms int64) Event {
	return t.pack(a, buf, t.enc.AppendChange((*buf)[:0], c), c.Row, nil, c.Op, c.LSN, c.Seq, tx, idTag, ms)
}

// pack makes the event whose payload is b (in *buf, which it may grow): the payload, the id and the
// partition name (t's of row; when row is nil, part, already rendered) are one copy into a.
func (t *snapTable) pack(a *arena, buf *[]byte, b []byte, row event.Row, part []byte, op, lsn string, seq uint64, tx, idTag string, ms int64) Event {
	n := len(b)
	b, idEnd := t.appendID(b, row, part, seq, tx, idTag)
	*buf = b
	return t.eventOf(a.bytes(b), n, idEnd, op, lsn, tx, ms)
}

// appendID appends an event's id and partition name (t's of row; when row is nil, part, already
// rendered) to its payload b, and returns the end of the id.
func (t *snapTable) appendID(b []byte, row event.Row, part []byte, seq uint64, tx, idTag string) ([]byte, int) {
	b = append(b, tx...)
	b = append(b, ':')
	b = append(b, idTag...)
	b = strconv.AppendUint(b, seq, 10)
	idEnd := len(b)
	if t.enc.Part != nil {
		if row != nil {
			b = t.enc.AppendPartition(b, row)
		} else {
			b = append(b, part...)
		}
	}
	return b, idEnd
}

// eventOf makes the event of out, bytes an arena handed out: the payload (up to n), the id (up to
// idEnd) and the partition name.
func (t *snapTable) eventOf(out []byte, n, idEnd int, op, lsn, tx string, ms int64) Event {
	name := partition.Single
	if t.enc.Part != nil {
		name = arenaString(out[idEnd:])
	}
	return Event{Queue: t.info.Queue, Partition: name, ID: arenaString(out[n:idEnd]), Tx: tx,
		Op: op, Table: t.full, LSN: lsn, CreatedMs: ms, Payload: out[:n:n]}
}
