package source

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pointer"
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

type itemKind uint8

const (
	itemChange   itemKind = iota // one raw change: zero (unmapped, skipped truncate), one or two events
	itemCommit                   // the end of the transaction committing at commit
	itemPosition                 // an idle advance: every commit ≤ lsn is in
)

// item is the unit the WAL reader hands to the bundler.
type item struct {
	kind   itemKind
	commit pglogrepl.LSN
	seq    uint64
	events []Event
	size   int
	lsn    pglogrepl.LSN
	chunk  *chunkPart // itemChunk (internal/source/snapshot.go): the snapshot cursor after this part
}

// relCol is a column of a Relation message.
type relCol struct {
	name string
	typ  *convert.Type
}

// relation is a table as the stream describes it, mapped to its configuration.
type relation struct {
	info  *TableInfo // nil: not configured (an unmanaged publication's extra table)
	full  string     // "schema.name"
	cols  []relCol
	key   []int // column indexes of the key, in key order
	part  []int // column indexes of partition_by columns (nil: single)
	ident byte  // 'f' for REPLICA IDENTITY FULL
}

// tuple is a row as pgoutput sent it.
type tuple []*pglogrepl.TupleDataColumn

// readbackFunc reads the current values of cols of rel's row with the given key (nil when gone),
// as seen once transaction xid (the one being decoded) is visible to other sessions.
type readbackFunc func(ctx context.Context, rel *relation, key tuple, cols []int, xid uint32) (tuple, error)

// decoder turns pgoutput messages into items, in commit order, dropping what the start pointer covers.
type decoder struct {
	epoch    string
	start    pointer.Pointer
	truncEm  bool
	tables   map[string]*TableInfo
	reg      *convert.Registry
	loadType func(ctx context.Context, oids []uint32) error
	readback readbackFunc
	rels     map[uint32]*relation

	inTxn  bool
	commit pglogrepl.LSN
	xid    uint32
	ts     string
	tsMs   int64
	seq    uint64
	txID   string
	lsn    string // commit LSN as PostgreSQL prints it, once per transaction

	truncatesSkipped uint64
	badMessages      uint64 // pgrelay.publish() messages that were not {queue, partition, payload}
	buf              []byte
}

// handle decodes one pgoutput message; emit receives the items (and may block).
func (d *decoder) handle(ctx context.Context, m pglogrepl.Message, emit func(item) error) error {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		return d.relation(ctx, m)
	case *pglogrepl.BeginMessage:
		d.inTxn, d.commit, d.xid, d.seq = true, m.FinalLSN, m.Xid, 0
		d.ts = m.CommitTime.UTC().Format("2006-01-02T15:04:05.000000Z")
		d.tsMs = m.CommitTime.UnixMilli()
		d.txID = pointer.TxID(d.epoch, m.FinalLSN)
		d.lsn = m.FinalLSN.String()
		return nil
	case *pglogrepl.CommitMessage:
		d.inTxn = false
		if m.CommitLSN <= d.start.LSNValue() {
			return nil
		}
		return emit(item{kind: itemCommit, commit: m.CommitLSN})
	case *pglogrepl.InsertMessage:
		return d.change(ctx, m.RelationID, emit, func(rel *relation) ([]Event, error) {
			return d.insert(rel, m.Tuple.Columns), nil
		})
	case *pglogrepl.UpdateMessage:
		return d.change(ctx, m.RelationID, emit, func(rel *relation) ([]Event, error) {
			var old tuple
			if m.OldTuple != nil {
				old = m.OldTuple.Columns
			}
			return d.update(ctx, rel, old, m.NewTuple.Columns)
		})
	case *pglogrepl.DeleteMessage:
		return d.change(ctx, m.RelationID, emit, func(rel *relation) ([]Event, error) {
			return d.delete(rel, m.OldTuple.Columns), nil
		})
	case *pglogrepl.TruncateMessage:
		return d.truncate(m, emit)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Transactional && d.inTxn && m.Prefix == PublishPrefix {
			return d.published(m, emit)
		}
	}
	return nil
}

// PublishPrefix is the logical message prefix of pgrelay.publish() (resources/source_publish.sql).
const PublishPrefix = "pgrelay"

// published turns a pgrelay.publish() message into an `m` event: `after` holds the payload.
// It counts as a change in seq, like a row change of the same transaction.
func (d *decoder) published(m *pglogrepl.LogicalDecodingMessage, emit func(item) error) error {
	seq := d.seq
	d.seq++
	if d.start.Covered(d.commit, seq) {
		return nil
	}
	var msg struct {
		Queue     string          `json:"queue"`
		Partition *string         `json:"partition"`
		Payload   json.RawMessage `json:"payload"`
	}
	it := item{kind: itemChange, commit: d.commit, seq: seq}
	if err := json.Unmarshal(m.Content, &msg); err != nil || msg.Queue == "" || len(msg.Payload) == 0 {
		d.badMessages++
		return emit(it) // counted in seq, nothing to send
	}
	part := partition.Single
	if msg.Partition != nil {
		part = *msg.Partition
	}
	lsn := d.commit.String()
	b := append([]byte(`{"op":"m","table":null,"key":null,"after":`), msg.Payload...)
	b = append(b, `,"before":null,"lsn":"`...)
	b = append(b, lsn...)
	b = append(b, `","xid":`...)
	b = strconv.AppendUint(b, uint64(d.xid), 10)
	b = append(b, `,"ts":"`...)
	b = append(b, d.ts...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, '}')
	ev := Event{Queue: msg.Queue, Partition: part, ID: pointer.MessageID(d.epoch, d.commit, seq, 0), Tx: d.txID,
		Op: "m", LSN: lsn, Xid: d.xid, CreatedMs: d.tsMs, Payload: b}
	it.events, it.size = []Event{ev}, ev.size()
	return emit(it)
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
	it := item{kind: itemChange, commit: d.commit, seq: seq, events: events}
	for i := range events {
		it.size += events[i].size()
	}
	return emit(it)
}

func (d *decoder) relation(ctx context.Context, m *pglogrepl.RelationMessage) error {
	rel := &relation{full: m.Namespace + "." + m.RelationName, ident: m.ReplicaIdentity}
	oids := make([]uint32, 0, len(m.Columns))
	for _, c := range m.Columns {
		oids = append(oids, c.DataType)
	}
	if err := d.loadType(ctx, oids); err != nil {
		return err
	}
	for _, c := range m.Columns {
		rel.cols = append(rel.cols, relCol{name: c.Name, typ: d.reg.Lookup(c.DataType)})
	}
	info := d.tables[rel.full]
	if info != nil {
		var err error
		if rel.key, err = rel.indexes(info.Key, "key"); err != nil {
			return err
		}
		switch info.Mode {
		case PartitionByKey:
			rel.part = rel.key
		case PartitionByColumns:
			if rel.part, err = rel.indexes(info.Columns, "partition_by"); err != nil {
				return err
			}
		}
		rel.info = info
	}
	d.rels[m.RelationID] = rel
	return nil
}

func (rel *relation) indexes(names []string, what string) ([]int, error) {
	out := make([]int, 0, len(names))
	for _, n := range names {
		i := -1
		for j, c := range rel.cols {
			if c.name == n {
				i = j
			}
		}
		if i < 0 {
			return nil, errcode.New("relation_changed", fmt.Sprintf("the stream's description of %s lacks %s column %s", rel.full, what, n),
				"restore the column (or the publication's column list), then restart pg_cdc")
		}
		out = append(out, i)
	}
	return out, nil
}

// partitionName renders t's partition (DESIGN §3).
func (rel *relation) partitionName(t tuple) string {
	if rel.part == nil {
		return partition.Single
	}
	vals := make([]partition.Value, len(rel.part))
	for i, c := range rel.part {
		vals[i] = partition.Value{Text: t[c].Data, Null: t[c].DataType == pglogrepl.TupleDataTypeNull}
	}
	return partition.Name(vals)
}

func (d *decoder) insert(rel *relation, row tuple) []Event {
	return []Event{d.event(rel, "c", rel.partitionName(row), 0, row, row, nil, nil)}
}

func (d *decoder) delete(rel *relation, old tuple) []Event {
	return []Event{d.event(rel, "d", rel.partitionName(old), 0, old, nil, d.beforeCols(rel, true), nil)}
}

// beforeCols are the columns of `before`: the whole old row under FULL, else the key (or none).
func (d *decoder) beforeCols(rel *relation, keyChanged bool) []int {
	if rel.ident == 'f' {
		return allCols(len(rel.cols))
	}
	if keyChanged {
		return rel.key
	}
	return nil
}

func allCols(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func (d *decoder) update(ctx context.Context, rel *relation, old, row tuple) ([]Event, error) {
	if rel.ident == 'f' && old != nil {
		for i, c := range row { // FULL sends the whole old row: it holds the unchanged values
			if c.DataType == pglogrepl.TupleDataTypeToast && i < len(old) && old[i].DataType != pglogrepl.TupleDataTypeToast {
				row[i] = old[i]
			}
		}
	}
	if old == nil {
		old = row
	}
	keyChanged := !sameValues(old, row, rel.key)
	newPart, oldPart := rel.partitionName(row), rel.partitionName(old)
	if newPart == oldPart {
		return []Event{d.event(rel, "u", newPart, 0, row, row, d.beforeCols(rel, keyChanged), old)}, nil
	}
	del := d.event(rel, "d", oldPart, 0, old, nil, d.beforeCols(rel, true), old)
	if missing := unchangedCols(row); len(missing) > 0 {
		got, err := d.readback(ctx, rel, row, missing, d.xid)
		if err != nil {
			return nil, err
		}
		if got != nil {
			for i, c := range missing {
				row[c] = got[i]
			}
		}
	}
	return []Event{del, d.event(rel, "c", newPart, 1, row, row, nil, nil)}, nil
}

func unchangedCols(row tuple) []int {
	var out []int
	for i, c := range row {
		if c.DataType == pglogrepl.TupleDataTypeToast {
			out = append(out, i)
		}
	}
	return out
}

func sameValues(a, b tuple, cols []int) bool {
	for _, c := range cols {
		if a[c].DataType != b[c].DataType || !bytes.Equal(a[c].Data, b[c].Data) {
			return false
		}
	}
	return true
}

// event renders one change event in DESIGN §2 field order. keyRow supplies `key`; after (nil for
// d) supplies `after` minus unchanged columns; beforeCols of beforeRow supply `before`.
func (d *decoder) event(rel *relation, op, part string, k int, keyRow, after tuple, beforeCols []int, beforeRow tuple) Event {
	b := d.buf[:0]
	b = append(b, `{"op":"`...)
	b = append(b, op...)
	b = append(b, `","table":`...)
	b = convert.AppendString(b, []byte(rel.full))
	b = append(b, `,"key":`...)
	b = d.appendObject(b, rel, keyRow, rel.key)
	b = append(b, `,"after":`...)
	var unchanged []int
	if after == nil {
		b = append(b, "null"...)
	} else {
		b = d.appendObject(b, rel, after, allCols(len(rel.cols)))
		unchanged = unchangedCols(after)
	}
	b = append(b, `,"before":`...)
	if beforeCols == nil {
		b = append(b, "null"...)
	} else {
		if beforeRow == nil {
			beforeRow = keyRow
		}
		b = d.appendObject(b, rel, beforeRow, beforeCols)
	}
	if len(unchanged) > 0 {
		b = append(b, `,"unchanged":[`...)
		for i, c := range unchanged {
			if i > 0 {
				b = append(b, ',')
			}
			b = convert.AppendString(b, []byte(rel.cols[c].name))
		}
		b = append(b, ']')
	}
	b = append(b, `,"lsn":"`...)
	b = append(b, d.lsn...)
	b = append(b, `","xid":`...)
	b = strconv.AppendUint(b, uint64(d.xid), 10)
	b = append(b, `,"ts":"`...)
	b = append(b, d.ts...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, d.seq-1, 10)
	b = append(b, '}')
	payload := append([]byte(nil), b...)
	// the id is pointer.MessageID, built on the transaction's id with one allocation
	id := append(b[:0], d.txID...)
	id = append(id, ':')
	id = strconv.AppendUint(id, d.seq-1, 10)
	if k > 0 {
		id = append(id, '.')
		id = strconv.AppendInt(id, int64(k), 10)
	}
	d.buf = id
	return Event{
		Queue: rel.info.Queue, Partition: part, ID: string(id), Tx: d.txID,
		Op: op, Table: rel.full, LSN: d.lsn, Xid: d.xid, CreatedMs: d.tsMs, Payload: payload,
	}
}

// appendObject renders the given columns of t, skipping unchanged TOASTed values.
func (d *decoder) appendObject(b []byte, rel *relation, t tuple, cols []int) []byte {
	b = append(b, '{')
	n := 0
	for _, c := range cols {
		v := t[c]
		if v.DataType == pglogrepl.TupleDataTypeToast {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = convert.AppendString(b, []byte(rel.cols[c].name))
		b = append(b, ':')
		if v.DataType == pglogrepl.TupleDataTypeNull {
			b = convert.AppendNull(b)
		} else {
			b = convert.Append(b, rel.cols[c].typ, v.Data)
		}
	}
	return append(b, '}')
}

func (d *decoder) truncate(m *pglogrepl.TruncateMessage, emit func(item) error) error {
	seq := d.seq
	d.seq++
	if d.start.Covered(d.commit, seq) {
		return nil
	}
	it := item{kind: itemChange, commit: d.commit, seq: seq}
	if !d.truncEm {
		d.truncatesSkipped++
		return emit(it)
	}
	k := 0
	for _, id := range m.RelationIDs {
		rel := d.rels[id]
		if rel == nil || rel.info == nil {
			continue
		}
		lsn := d.commit.String()
		payload := fmt.Sprintf(`{"op":"t","table":%s,"key":null,"after":null,"before":null,"lsn":"%s","xid":%d,"ts":"%s","seq":%d}`,
			convert.AppendString(nil, []byte(rel.full)), lsn, d.xid, d.ts, seq)
		ev := Event{Queue: rel.info.Queue, Partition: partition.Single, ID: pointer.MessageID(d.epoch, d.commit, seq, k), Tx: d.txID,
			Op: "t", Table: rel.full, LSN: lsn, Xid: d.xid, CreatedMs: d.tsMs, Payload: []byte(payload)}
		it.events = append(it.events, ev)
		it.size += ev.size()
		k++
	}
	return emit(it)
}
