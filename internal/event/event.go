// Package event writes the change event of docs/design.md §2: one JSON object per change, fields in
// the order op, table, key, after, before, unchanged, lsn, xid, ts, seq, and the name of the
// partition the event goes to (§3); and the envelope that carries the change events of one
// transaction (or one part of it) in a single message. The stream's decoder and the snapshotter both encode through
// it, with values converted by internal/convert, so an `r` and a `c` of the same row are
// byte-identical.
//
// A Table is prepared once per table (column names are escaped then); the Append functions
// append to a caller's buffer, so encoding a change allocates nothing by itself.
package event

import (
	"strconv"
	"time"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/partition"
)

var null = []byte("null")

// The ops of §2.
const (
	OpRead     = "r" // a snapshot read
	OpInsert   = "c"
	OpUpdate   = "u" // also a snapshot fill
	OpDelete   = "d"
	OpTruncate = "t"
	OpMessage  = "m" // a message published with pgrelay.publish()
	// OpEnvelope is an envelope: the change events of one transaction (or snapshot chunk) for one
	// queue, in one message.
	OpEnvelope = "x"
)

// TimeFormat is the layout of `ts` (the time in UTC, with microseconds).
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// FormatTime is t in UTC in TimeFormat, written by hand: the stream formats one per transaction,
// and time.Format interprets its layout each time. Years outside 0-9999 go through time.Format.
func FormatTime(t time.Time) string {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Format(TimeFormat)
	}
	hour, minute, sec := t.Clock()
	var b [len(TimeFormat)]byte
	put := func(i, v, n int) {
		for k := i + n - 1; k >= i; k-- {
			b[k] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, year, 4)
	b[4] = '-'
	put(5, int(month), 2)
	b[7] = '-'
	put(8, day, 2)
	b[10] = 'T'
	put(11, hour, 2)
	b[13] = ':'
	put(14, minute, 2)
	b[16] = ':'
	put(17, sec, 2)
	b[19] = '.'
	put(20, t.Nanosecond()/1000, 6)
	b[26] = 'Z'
	return string(b[:])
}

// Kind says what a Value holds, as pgoutput's tuple data does.
type Kind uint8

// The kinds of value.
const (
	Text      Kind = iota // Data is the value as PostgreSQL's output function printed it
	Null                  // SQL NULL
	Unchanged             // an unchanged TOASTed value the server did not send (never NULL)
)

// Value is one column's value.
type Value struct {
	Data []byte
	Kind Kind
}

// Row is a row's values in column order.
type Row []Value

// TextRow fills dst (reusing its array) with vals, text values of which nil is NULL, the form of
// query result rows.
func TextRow(dst Row, vals [][]byte) Row {
	dst = dst[:0]
	for _, v := range vals {
		if v == nil {
			dst = append(dst, Value{Kind: Null})
		} else {
			dst = append(dst, Value{Data: v})
		}
	}
	return dst
}

// Column is one column of a Table.
type Column struct {
	Name string
	Type *convert.Type
}

// Table is what the encoder knows of one table.
type Table struct {
	Name    string   // "schema.name"
	Columns []Column // the published columns, in the order of a Row
	Key     []int    // indexes of the key columns, in key order; none: `key` is null (an append-only table without a key)
	Part    []int    // indexes of the partition_by columns; nil: the single partition

	nameJSON []byte   // Name as a JSON string
	colJSON  [][]byte // each column's name as a JSON string followed by ':'
	all      []int    // 0..len(Columns)-1
}

// NewTable prepares a table for encoding.
func NewTable(name string, cols []Column, key, part []int) *Table {
	t := &Table{Name: name, Columns: cols, Key: key, Part: part, nameJSON: convert.AppendString(nil, []byte(name)),
		colJSON: make([][]byte, len(cols)), all: make([]int, len(cols))}
	for i, c := range cols {
		t.colJSON[i] = append(convert.AppendString(nil, []byte(c.Name)), ':')
		t.all[i] = i
	}
	return t
}

// All lists every column's index: the columns of `before` under REPLICA IDENTITY FULL.
func (t *Table) All() []int { return t.all }

// Position is the tail of an event.
type Position struct {
	LSN string // the commit LSN (a snapshot event's: the chunk's high watermark) as PostgreSQL prints it
	Xid uint32 // the transaction id; 0 (never a decoded transaction's) leaves xid out, as r and fills do
	TS  string // the commit time (a snapshot event's: the chunk's read time) in TimeFormat
	Seq uint64 // the index of the change in its transaction or chunk
}

// Change is one row change.
type Change struct {
	Op  string // OpRead, OpInsert, OpUpdate or OpDelete
	Row Row    // supplies `key`, and `after` unless Op is OpDelete
	// BeforeCols are the columns of `before` (nil: before is null), taken from Before (nil: Row).
	BeforeCols []int
	Before     Row
	Position
}

// AppendChange appends the event of c. Unchanged values are left out of every object and, for
// `after`, listed in `unchanged`.
func (t *Table) AppendChange(dst []byte, c *Change) []byte {
	return AppendTail(t.AppendChangeBody(dst, c), &c.Position)
}

// AppendChangeBody appends the event of c up to its tail (lsn, xid, ts, seq), which AppendTail
// appends: a snapshot renders its rows as they arrive, before it knows the chunk's high watermark.
// c.Position is not read.
func (t *Table) AppendChangeBody(dst []byte, c *Change) []byte {
	b := appendHead(dst, c.Op, t.nameJSON)
	b = append(b, `,"key":`...)
	if len(t.Key) == 0 { // a table without a key (append-only): no key columns, so no key object
		b = convert.AppendNull(b)
	} else {
		b = t.appendObject(b, c.Row, t.Key)
	}
	b = append(b, `,"after":`...)
	after := c.Op != OpDelete
	if after {
		b = t.appendObject(b, c.Row, t.all)
	} else {
		b = convert.AppendNull(b)
	}
	b = append(b, `,"before":`...)
	if c.BeforeCols == nil {
		b = convert.AppendNull(b)
	} else {
		before := c.Before
		if before == nil {
			before = c.Row
		}
		b = t.appendObject(b, before, c.BeforeCols)
	}
	if after {
		b = t.appendUnchanged(b, c.Row)
	}
	return b
}

// AppendKey appends the `key` object of r: the form in which a snapshot chunk matches the stream's
// changes to its rows.
func (t *Table) AppendKey(dst []byte, r Row) []byte { return t.appendObject(dst, r, t.Key) }

// AppendTruncate appends the `t` event of a TRUNCATE of t.
func (t *Table) AppendTruncate(dst []byte, pos *Position) []byte {
	b := appendHead(dst, OpTruncate, t.nameJSON)
	b = append(b, `,"key":null,"after":null,"before":null`...)
	return AppendTail(b, pos)
}

// AppendMessage appends the `m` event of a published message: `after` is its payload, JSON as is.
func AppendMessage(dst []byte, payload []byte, pos *Position) []byte {
	b := appendHead(dst, OpMessage, null)
	b = append(b, `,"key":null,"after":`...)
	b = append(b, payload...)
	b = append(b, `,"before":null`...)
	return AppendTail(b, pos)
}

// Envelope is the head of an envelope (§2): one message holding, in order, the change events of one
// transaction for one queue, or of one part of a transaction split at the size limits.
type Envelope struct {
	ID   string // the transaction's id (§3: pg:<epoch>:<commit LSN>, a chunk's pg:<epoch>:s:<hw LSN>)
	LSN  string // the commit LSN (a chunk's: its high watermark) as PostgreSQL prints it
	Xid  uint32 // the transaction id; 0 leaves xid out, as a chunk's does
	TS   string // the commit time (a chunk's: its read time) in TimeFormat
	Part uint64 // 1, 2, ... in the order the parts were written
	Last bool   // this part ends the transaction (or chunk) for its queue
}

// EnvelopeEnd closes an envelope opened by AppendEnvelopeHead.
const EnvelopeEnd = "]}"

// AppendEnvelopeHead appends the fields of an envelope, in the order op, id, lsn, xid, ts, part,
// last, and opens its `events` array: the caller appends the events, separated by commas, then
// EnvelopeEnd.
func AppendEnvelopeHead(dst []byte, h *Envelope) []byte {
	b := append(dst, `{"op":"`+OpEnvelope+`","id":"`...)
	b = append(b, h.ID...) // pg:, hex digits and colons: nothing to escape
	b = append(b, `","lsn":"`...)
	b = append(b, h.LSN...)
	b = append(b, '"')
	if h.Xid != 0 {
		b = append(b, `,"xid":`...)
		b = strconv.AppendUint(b, uint64(h.Xid), 10)
	}
	b = append(b, `,"ts":"`...)
	b = append(b, h.TS...)
	b = append(b, `","part":`...)
	b = strconv.AppendUint(b, h.Part, 10)
	b = append(b, `,"last":`...)
	b = strconv.AppendBool(b, h.Last)
	return append(b, `,"events":[`...)
}

// AppendEnvelope appends a whole envelope: its head, then events (change events as the Append
// functions write them, separated by commas), then its end.
func AppendEnvelope(dst []byte, h *Envelope, events []byte) []byte {
	b := AppendEnvelopeHead(dst, h)
	b = append(b, events...)
	return append(b, EnvelopeEnd...)
}

// Partition names the partition of r (§3).
func (t *Table) Partition(r Row) string {
	if t.Part == nil {
		return partition.Single
	}
	return string(t.AppendPartition(nil, r))
}

// AppendPartition appends the name of r's partition (§3) to dst.
func (t *Table) AppendPartition(dst []byte, r Row) []byte {
	if t.Part == nil {
		return append(dst, partition.Single...)
	}
	var small [4]partition.Value
	vals := small[:0]
	for _, c := range t.Part {
		vals = append(vals, partition.Value{Text: r[c].Data, Null: r[c].Kind == Null})
	}
	return partition.AppendName(dst, vals)
}

func appendHead(b []byte, op string, table []byte) []byte {
	b = append(b, `{"op":"`...)
	b = append(b, op...)
	b = append(b, `","table":`...)
	return append(b, table...)
}

// AppendTail appends the tail of an event, its position, and closes the event.
func AppendTail(b []byte, p *Position) []byte {
	b = append(b, `,"lsn":"`...)
	b = append(b, p.LSN...)
	b = append(b, '"')
	if p.Xid != 0 {
		b = append(b, `,"xid":`...)
		b = strconv.AppendUint(b, uint64(p.Xid), 10)
	}
	b = append(b, `,"ts":"`...)
	b = append(b, p.TS...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, p.Seq, 10)
	return append(b, '}')
}

// appendObject appends the given columns of r as an object, leaving unchanged values out.
func (t *Table) appendObject(b []byte, r Row, cols []int) []byte {
	b = append(b, '{')
	n := 0
	for _, c := range cols {
		v := &r[c]
		if v.Kind == Unchanged {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, t.colJSON[c]...)
		if v.Kind == Null {
			b = convert.AppendNull(b)
		} else {
			b = convert.Append(b, t.Columns[c].Type, v.Data)
		}
	}
	return append(b, '}')
}

// appendUnchanged appends `unchanged`, the names of r's unchanged columns, when there are any.
func (t *Table) appendUnchanged(b []byte, r Row) []byte {
	n := 0
	for i := range r {
		if r[i].Kind != Unchanged {
			continue
		}
		if n == 0 {
			b = append(b, `,"unchanged":[`...)
		} else {
			b = append(b, ',')
		}
		n++
		name := t.colJSON[i]
		b = append(b, name[:len(name)-1]...)
	}
	if n > 0 {
		b = append(b, ']')
	}
	return b
}
