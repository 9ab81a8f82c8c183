package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// relation is a table as the stream describes it, mapped to its configuration.
type relation struct {
	info  *TableInfo   // nil: not configured (an unmanaged publication's extra table)
	table *event.Table // its name and columns; key and partition columns when configured
	ident byte         // 'f' for REPLICA IDENTITY FULL
	env   *envelope    // its queue's envelope; nil when its changes go one per message
}

// readbackFunc reads the current values of cols of rel's row with the given key (nil when gone),
// as seen once transaction xid (the one being decoded) is visible to other sessions.
type readbackFunc func(ctx context.Context, rel *relation, key event.Row, cols []int, xid uint32) (event.Row, error)

// decoder turns pgoutput messages into items, in commit order, dropping what the start pointer covers.
type decoder struct {
	epoch    string
	start    pointer.Pointer
	truncEm  bool
	tables   map[string]*TableInfo
	byOID    map[uint32]*TableInfo                                    // the configured tables by their oid at the session's start
	renamed  func(ctx context.Context, t *TableInfo, inStream string) // a configured table met under another name
	reg      *convert.Registry
	loadType func(ctx context.Context, oids []uint32) error
	readback readbackFunc
	rels     map[uint32]*relation

	inTxn  bool
	commit pglogrepl.LSN
	pos    event.Position // the transaction's lsn, xid and ts (Seq is set per change)
	tsMs   int64
	at     time.Time // the transaction's commit time
	seq    uint64
	txID   string

	truncatesSkipped uint64
	badMessages      uint64       // pgrelay.publish() messages that were not {queue, partition, payload}
	pubQueue         string       // the queue of the last published message
	rows             [2]event.Row // the new and the old row of the change being decoded
	buf              []byte
	arena            arena     // the events' bytes
	slab             eventSlab // the events of queued changes

	envs                  map[string]*envelope // the enveloped queues (nil: none)
	seg                   segment              // the transaction's envelopes and open parts
	maxMessages, maxBytes int                  // the bundle limits, which a segment stays within
}

// decode decodes one pgoutput message; emit receives the items (and may block). Row changes,
// Begin, Commit and transactional logical messages are read in place; with one-change
// transactions the latter three are most of the stream, and pglogrepl's parse allocates a
// message (and a prefix string) for each.
func (d *decoder) decode(ctx context.Context, data []byte, emit func(item) error) error {
	if len(data) > 0 {
		switch data[0] {
		case 'I', 'U', 'D':
			return d.rowChange(ctx, data, emit)
		case 'B':
			if len(data) == 21 { // final LSN, commit time, xid
				d.begin(pglogrepl.LSN(binary.BigEndian.Uint64(data[1:])), pgTime(int64(binary.BigEndian.Uint64(data[9:]))), binary.BigEndian.Uint32(data[17:]))
				return nil
			}
		case 'C':
			if len(data) == 26 { // flags, commit LSN, end LSN, commit time
				return d.commitTx(pglogrepl.LSN(binary.BigEndian.Uint64(data[2:])), emit)
			}
		case 'M':
			if m, ok := parseMessage(data); ok && m.transactional {
				return d.message(m, emit)
			}
		}
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput: %w", err)
	}
	return d.handle(ctx, msg, emit)
}

// handle decodes a pgoutput message other than a row change, as pglogrepl parsed it.
func (d *decoder) handle(ctx context.Context, m pglogrepl.Message, emit func(item) error) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		return d.relation(ctx, m)
	case *pglogrepl.BeginMessage:
		d.begin(m.FinalLSN, m.CommitTime, m.Xid)
		return nil
	case *pglogrepl.CommitMessage:
		return d.commitTx(m.CommitLSN, emit)
	case *pglogrepl.TruncateMessage:
		return d.truncate(m, emit)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Transactional && d.inTxn && m.Prefix == PublishPrefix {
			return d.published(m.Content, emit)
		}
	}
	return nil
}

// begin starts the transaction committing at final.
func (d *decoder) begin(final pglogrepl.LSN, commitTime time.Time, xid uint32) {
	d.inTxn, d.commit, d.seq = true, final, 0
	d.pos = event.Position{LSN: pointer.FormatLSN(final), Xid: xid, TS: event.FormatTime(commitTime)}
	d.tsMs, d.at = commitTime.UnixMilli(), commitTime
	d.txID = pointer.TxID(d.epoch, final)
	if d.envs != nil {
		d.beginEnvelopes()
	}
}

// commitTx ends the transaction committing at commit.
func (d *decoder) commitTx(commit pglogrepl.LSN, emit func(item) error) error {
	d.inTxn = false
	if commit <= d.start.LSNValue() {
		return nil
	}
	if len(d.seg.envs) > 0 {
		if err := d.finishEnvelopes(emit); err != nil {
			return err
		}
	}
	return emit(item{kind: itemCommit, commit: commit})
}

// message decodes a transactional logical message: a pgrelay.publish() message becomes an
// event; others are ignored.
func (d *decoder) message(m logicalMessage, emit func(item) error) error {
	if d.inTxn && string(m.prefix) == PublishPrefix {
		return d.published(m.content, emit)
	}
	return nil
}

// pgEpoch is PostgreSQL's timestamp epoch (2000-01-01 UTC) in unix µs.
const pgEpoch = 946_684_800_000_000

// pgTime is the time of a PostgreSQL timestamp (µs since 2000-01-01 UTC).
func pgTime(us int64) time.Time { return time.UnixMicro(pgEpoch + us) }

// logicalMessage is a pgoutput logical decoding message ('M'), its prefix and content aliasing
// the message's bytes.
type logicalMessage struct {
	transactional   bool
	lsn             pglogrepl.LSN
	prefix, content []byte
}

// parseMessage reads an 'M' message of protocol version 1: flags, LSN, prefix (NUL-terminated),
// content length and content. ok is false when it does not have that form.
func parseMessage(b []byte) (m logicalMessage, ok bool) {
	if len(b) < 10 || b[0] != 'M' {
		return m, false
	}
	m.transactional, m.lsn = b[1] == 1, pglogrepl.LSN(binary.BigEndian.Uint64(b[2:]))
	rest := b[10:]
	end := bytes.IndexByte(rest, 0)
	if end < 0 || len(rest) < end+5 {
		return m, false
	}
	m.prefix, rest = rest[:end], rest[end+1:]
	n := binary.BigEndian.Uint32(rest)
	if uint64(len(rest)-4) != uint64(n) {
		return m, false
	}
	m.content = rest[4:]
	return m, true
}

// PublishPrefix is the logical message prefix of pgrelay.publish() (resources/source_publish.sql).
const PublishPrefix = "pgrelay"

// published turns a pgrelay.publish() message into an `m` event: `after` holds the payload.
// It counts as a change in seq, like a row change of the same transaction.
func (d *decoder) published(content []byte, emit func(item) error) error {
	seq := d.seq
	d.seq++
	if d.start.Covered(d.commit, seq) {
		return nil
	}
	msg, ok := parsePublished(content)
	if !ok {
		d.badMessages++
		return d.emitChange(seq, nil, emit) // counted in seq, nothing to send
	}
	pos := d.pos
	pos.Seq = seq
	if env := d.envs[string(msg.queue)]; env != nil { // its place in the envelope (the partition is the envelope's)
		d.envEnd(env, event.AppendMessage(d.envStart(env), msg.payload, &pos))
		return d.emitChange(seq, nil, emit)
	}
	if string(msg.queue) != d.pubQueue {
		d.pubQueue = string(msg.queue)
	}
	part := partition.Single
	if msg.partitioned {
		part = d.arena.string(msg.partition)
	}
	payload, id := d.withID(event.AppendMessage(d.buf[:0], msg.payload, &pos), seq, 0)
	evs := d.slab.take(1)
	evs[0] = Event{Queue: d.pubQueue, Partition: part, ID: id, Tx: d.txID, Op: event.OpMessage, LSN: pos.LSN, Xid: pos.Xid,
		CreatedMs: d.tsMs, Payload: payload}
	return d.emitChange(seq, evs, emit)
}

// publishedMessage is the content of a pgrelay.publish() message (resources/source_publish.sql),
// its values as they stand in the content.
type publishedMessage struct {
	queue       []byte
	partition   []byte
	partitioned bool // partition is a string: not null or left out (the single partition)
	payload     []byte
}

// parsePublished reads {"queue": string, "partition": string or null, "payload": any JSON} (other
// members are ignored; keys match exactly). ok is false for anything else, a document that is not
// valid JSON included. It copies nothing unless a string holds an escape: parsing with
// encoding/json cost more than the rest of the event.
func parsePublished(b []byte) (m publishedMessage, ok bool) {
	err := jsonscan.Members(b, func(key []byte, _ bool, v0, v1 int) error {
		name, err := jsonscan.Text(key)
		if err != nil {
			return err
		}
		v := b[v0:v1]
		switch string(name) {
		case "queue":
			m.queue, err = jsonscan.Text(v)
		case "partition":
			m.partition, m.partitioned = nil, false
			if string(v) != "null" {
				m.partition, err = jsonscan.Text(v)
				m.partitioned = err == nil
			}
		case "payload":
			m.payload = v
		}
		return err
	})
	return m, err == nil && len(m.queue) > 0 && len(m.payload) > 0
}

// change numbers one raw change and emits its events unless the start pointer covers it.
func (d *decoder) change(ctx context.Context, relID uint32, emit func(item) error, build func(*relation) ([]Event, error)) error {
	seq := d.seq
	d.seq++
	if d.start.Covered(d.commit, seq) {
		return nil
	}
	rel, ok := d.rels[relID]
	if !ok {
		return fmt.Errorf("pgoutput: change for unknown relation %d", relID)
	}
	var events []Event
	if rel.info != nil {
		var err error
		if events, err = build(rel); err != nil {
			return err
		}
	}
	return d.emitChange(seq, events, emit)
}

func (d *decoder) relation(ctx context.Context, m *pglogrepl.RelationMessage) error {
	full := m.Namespace + "." + m.RelationName
	oids := make([]uint32, 0, len(m.Columns))
	for _, c := range m.Columns {
		oids = append(oids, c.DataType)
	}
	if err := d.loadType(ctx, oids); err != nil {
		return err
	}
	cols := make([]event.Column, len(m.Columns))
	for i, c := range m.Columns {
		cols[i] = event.Column{Name: c.Name, Type: d.reg.Lookup(c.DataType)}
	}
	var key, part []int
	var env *envelope
	info := d.tables[full]
	if info == nil && d.byOID[m.RelationID] != nil {
		// A configured table under another name: renamed after (or, for a session started with
		// its new name, before) the change. Its changes keep their configured table and name.
		info = d.byOID[m.RelationID]
		if d.renamed != nil {
			d.renamed(ctx, info, full)
		}
		full = info.Full()
	}
	if info != nil {
		env = d.envs[info.Queue]
		var err error
		if key, err = columnIndexes(full, cols, info.Key, "key"); err != nil {
			return err
		}
		switch {
		case env != nil: // an envelope's events are not partitioned: a key change is one u
		case info.Mode == PartitionByKey:
			part = key
		case info.Mode == PartitionByColumns:
			if part, err = columnIndexes(full, cols, info.Columns, "partition_by"); err != nil {
				return err
			}
		}
	}
	d.rels[m.RelationID] = &relation{info: info, table: event.NewTable(full, cols, key, part), ident: m.ReplicaIdentity, env: env}
	return nil
}

// columnIndexes finds the named columns of table full among cols.
func columnIndexes(full string, cols []event.Column, names []string, what string) ([]int, error) {
	out := make([]int, 0, len(names))
	for _, n := range names {
		i := slices.IndexFunc(cols, func(c event.Column) bool { return c.Name == n })
		if i < 0 {
			return nil, errcode.New(errcode.RelationChanged, fmt.Sprintf("the stream's description of %s lacks %s column %s", full, what, n),
				"restore the column (or the publication's column list), then restart pg_cdc")
		}
		out = append(out, i)
	}
	return out, nil
}

// rowChange decodes an Insert, Update or Delete message (protocol version 1). It reads the
// message itself rather than through pglogrepl, whose parse allocates the message, a column slice
// and a copy of every value: the values stay in data, which lives until the change is encoded.
func (d *decoder) rowChange(ctx context.Context, data []byte, emit func(item) error) error {
	op := data[0]
	if len(data) < 6 {
		return fmt.Errorf("decode pgoutput: %c message of %d bytes", op, len(data))
	}
	relID := binary.BigEndian.Uint32(data[1:])
	var newRow, oldRow event.Row
	var err error
	rest := data[5:]
	hasOld := (op == 'U' || op == 'D') && (rest[0] == 'K' || rest[0] == 'O')
	if hasOld {
		if oldRow, rest, err = d.tuple(1, rest[1:]); err != nil {
			return fmt.Errorf("decode pgoutput: %c message: old tuple: %w", op, err)
		}
	}
	if op != 'D' {
		if len(rest) == 0 || rest[0] != 'N' {
			return fmt.Errorf("decode pgoutput: %c message without a new tuple", op)
		}
		if newRow, _, err = d.tuple(0, rest[1:]); err != nil {
			return fmt.Errorf("decode pgoutput: %c message: new tuple: %w", op, err)
		}
	} else if !hasOld {
		return fmt.Errorf("decode pgoutput: D message without an old tuple")
	}
	return d.change(ctx, relID, emit, func(rel *relation) ([]Event, error) {
		switch op {
		case 'I':
			return d.insert(rel, newRow), nil
		case 'U':
			return d.update(ctx, rel, oldRow, newRow)
		default:
			return d.delete(rel, oldRow), nil
		}
	})
}

// tuple reads a TupleData into the decoder's row i (0 new, 1 old), reusing its array; the values
// point into b. It returns the row and the bytes after the tuple.
func (d *decoder) tuple(i int, b []byte) (event.Row, []byte, error) {
	if len(b) < 2 {
		return nil, nil, errors.New("truncated column count")
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	r := d.rows[i][:0]
	for c := 0; c < n; c++ {
		if len(b) == 0 {
			return nil, nil, fmt.Errorf("truncated at column %d of %d", c, n)
		}
		kind := b[0]
		b = b[1:]
		switch kind {
		case pglogrepl.TupleDataTypeNull:
			r = append(r, event.Value{Kind: event.Null})
		case pglogrepl.TupleDataTypeToast:
			r = append(r, event.Value{Kind: event.Unchanged})
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if len(b) < 4 {
				return nil, nil, fmt.Errorf("truncated length of column %d", c)
			}
			l := int(binary.BigEndian.Uint32(b))
			if l < 0 || len(b)-4 < l {
				return nil, nil, fmt.Errorf("column %d: %d bytes announced, %d left", c, l, len(b)-4)
			}
			r = append(r, event.Value{Data: b[4 : 4+l : 4+l]})
			b = b[4+l:]
		default:
			return nil, nil, fmt.Errorf("column %d: unknown kind %q", c, kind)
		}
	}
	d.rows[i] = r
	return r, b, nil
}

func (d *decoder) insert(rel *relation, row event.Row) []Event {
	return d.one(rel, row, &event.Change{Op: event.OpInsert, Row: row})
}

func (d *decoder) delete(rel *relation, old event.Row) []Event {
	return d.one(rel, old, &event.Change{Op: event.OpDelete, Row: old, BeforeCols: d.beforeCols(rel, true)})
}

// one renders a change that is one event, of row r's partition: into its queue's envelope, or as
// a message of its own.
func (d *decoder) one(rel *relation, r event.Row, c *event.Change) []Event {
	if rel.env != nil {
		d.envelop(rel, c)
		return nil
	}
	evs := d.slab.take(1)
	evs[0] = d.event(rel, d.partition(rel, r), 0, c)
	return evs
}

// partition names the partition of r, in the arena.
func (d *decoder) partition(rel *relation, r event.Row) string {
	if rel.table.Part == nil {
		return partition.Single
	}
	d.buf = rel.table.AppendPartition(d.buf[:0], r)
	return d.arena.string(d.buf)
}

// beforeCols are the columns of `before`: the whole old row under FULL, else the key (or none).
func (d *decoder) beforeCols(rel *relation, keyChanged bool) []int {
	if rel.ident == 'f' {
		return rel.table.All()
	}
	if keyChanged {
		return rel.table.Key
	}
	return nil
}

func (d *decoder) update(ctx context.Context, rel *relation, old, row event.Row) ([]Event, error) {
	if rel.ident == 'f' && old != nil {
		for i, c := range row { // FULL sends the whole old row: it holds the unchanged values
			if c.Kind == event.Unchanged && i < len(old) && old[i].Kind != event.Unchanged {
				row[i] = old[i]
			}
		}
	}
	if old == nil {
		old = row
	}
	keyChanged := !sameValues(old, row, rel.table.Key)
	newPart, oldPart := d.partition(rel, row), d.partition(rel, old)
	if newPart == oldPart {
		return d.one(rel, row, &event.Change{Op: event.OpUpdate, Row: row, BeforeCols: d.beforeCols(rel, keyChanged), Before: old}), nil
	}
	del := d.event(rel, oldPart, 0, &event.Change{Op: event.OpDelete, Row: old, BeforeCols: d.beforeCols(rel, true)})
	if missing := unchangedCols(row); len(missing) > 0 {
		got, err := d.readback(ctx, rel, row, missing, d.pos.Xid)
		if err != nil {
			return nil, err
		}
		if got != nil {
			for i, c := range missing {
				row[c] = got[i]
			}
		}
	}
	evs := d.slab.take(2)
	evs[0], evs[1] = del, d.event(rel, newPart, 1, &event.Change{Op: event.OpInsert, Row: row})
	return evs, nil
}

func unchangedCols(row event.Row) []int {
	var out []int
	for i, c := range row {
		if c.Kind == event.Unchanged {
			out = append(out, i)
		}
	}
	return out
}

func sameValues(a, b event.Row, cols []int) bool {
	for _, c := range cols {
		if a[c].Kind != b[c].Kind || !bytes.Equal(a[c].Data, b[c].Data) {
			return false
		}
	}
	return true
}

// event renders one change of the transaction (k numbers the events of one change) as an event to
// partition part of the table's queue. Its payload and id are one copy into the arena.
func (d *decoder) event(rel *relation, part string, k int, c *event.Change) Event {
	c.Position = d.pos
	c.Seq = d.seq - 1
	payload, id := d.withID(rel.table.AppendChange(d.buf[:0], c), c.Seq, k)
	return Event{
		Queue: rel.info.Queue, Partition: part, ID: id, Tx: d.txID,
		Op: c.Op, Table: rel.table.Name, LSN: d.pos.LSN, Xid: d.pos.Xid, CreatedMs: d.tsMs, Payload: payload,
	}
}

// withID copies payload b (d.buf's array, or a new one) and the id of event k of change seq into
// the arena, in one copy. The id is pointer.MessageID, built on the transaction's id.
func (d *decoder) withID(b []byte, seq uint64, k int) (payload []byte, id string) {
	n := len(b)
	b = append(b, d.txID...)
	b = append(b, ':')
	b = strconv.AppendUint(b, seq, 10)
	if k > 0 {
		b = append(b, '.')
		b = strconv.AppendInt(b, int64(k), 10)
	}
	d.buf = b
	out := d.arena.bytes(b)
	return out[:n:n], arenaString(out[n:])
}

func (d *decoder) truncate(m *pglogrepl.TruncateMessage, emit func(item) error) error {
	seq := d.seq
	d.seq++
	if d.start.Covered(d.commit, seq) {
		return nil
	}
	if !d.truncEm {
		d.truncatesSkipped++
		return d.emitChange(seq, nil, emit)
	}
	var events []Event
	k := 0
	for _, id := range m.RelationIDs {
		rel := d.rels[id]
		if rel == nil || rel.info == nil {
			continue
		}
		pos := d.pos
		pos.Seq = seq
		if rel.env != nil {
			d.envEnd(rel.env, rel.table.AppendTruncate(d.envStart(rel.env), &pos))
			continue
		}
		ev := Event{Queue: rel.info.Queue, Partition: partition.Single, ID: pointer.MessageID(d.epoch, d.commit, seq, k), Tx: d.txID,
			Op: event.OpTruncate, Table: rel.table.Name, LSN: pos.LSN, Xid: pos.Xid, CreatedMs: d.tsMs, Payload: rel.table.AppendTruncate(nil, &pos)}
		events = append(events, ev)
		k++
	}
	return d.emitChange(seq, events, emit)
}
