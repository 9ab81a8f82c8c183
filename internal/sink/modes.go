package sink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// opKind is what one message does to the target.
type opKind int

const (
	opWrite    opKind = iota // insert (append) or upsert (upsert, cdc c/r/u) of row
	opDelete                 // cdc d: delete by key
	opMove                   // cdc u whose key changed: move the row, then upsert row
	opTruncate               // cdc t
	opSQL                    // sql mode: the user's statement with params
	opNone                   // nothing to do (cdc m)
	opEnvelope               // cdc x: one source transaction's change events (sub), in order
)

// op is one decoded message.
type op struct {
	msg    *Message
	kind   opKind
	row    Row           // opWrite/opMove: the columns to write
	vals   rowVals       // append, upsert: the mapped row
	key    string        // fold identity of the (new) key
	oldKey []pgtype.Text // opMove: the old key; opDelete: the key
	newKey []pgtype.Text // opMove: the new key
	params []any         // opSQL
	mapped bool          // vals already holds the mapped row (append, upsert)
	to     *routed       // cdc with tables: the target it goes to (nil: the sink's one table)
	sub    []op          // opEnvelope: its events' ops, in order, each with msg
}

// modeHandler decodes messages (data errors per message) and plans decoded ops, in offset order,
// as statements the applier sends in one pipeline. buf is the batch's row memory (nil: none).
type modeHandler interface {
	decode(m *Message, buf *rowBuf) (op, error)
	plan(ops []op) ([]stmt, error)
}

// orderedPlanner is a mode whose plan may write ops in another order than theirs (mode cdc with
// tables groups them by target) and that can also plan them in order: the plan of one message
// alone, so an envelope's events apply as its source transaction did.
type orderedPlanner interface {
	planInOrder(ops []op) ([]stmt, error)
}

// newModeHandler returns the handler of cfg.Mode for the target's shape (nil target in sql mode);
// keys watches payload keys that name no column (nil: they are left out silently).
func newModeHandler(cfg *Config, t *Target, keys *unknownKeys) (modeHandler, error) {
	switch cfg.Mode {
	case ModeAppend:
		return appendMode{w: newWriter(t, cfg.Metadata).watching(keys)}, nil
	case ModeUpsert:
		return upsertMode{w: newWriter(t, cfg.Metadata).watching(keys)}, nil
	case ModeCDC:
		return cdcMode{w: newWriter(t, cfg.Metadata).watching(keys)}, nil
	case ModeSQL:
		return newSQLMode(cfg.Statement, cfg.Params)
	}
	return nil, fmt.Errorf("unknown mode %q", cfg.Mode)
}

// appendMode inserts every message as a new row.
type appendMode struct{ w *writer }

func (a appendMode) decode(m *Message, buf *rowBuf) (op, error) {
	vals, _, _, err := a.w.rowFromPayload(m.Payload, m, buf)
	return op{msg: m, kind: opWrite, vals: vals}, err
}

func (a appendMode) plan(ops []op) ([]stmt, error) {
	rows := make([]rowVals, len(ops))
	for i := range ops {
		rows[i] = ops[i].vals
	}
	return a.w.insertStmts(rows, false), nil
}

// changePayload names what payload is when it is an object with a change event's op, table and
// key or after, or an envelope's op and events (DESIGN §2): sent to a mode that reads rows, into a
// table without such columns (writer.events), a stream of change events. "" for anything else.
func changePayload(payload []byte) string {
	r, err := decodeObject(payload)
	if err != nil {
		return ""
	}
	_, hasOp := r["op"]
	_, hasTable := r["table"]
	_, hasKey := r["key"]
	_, hasAfter := r["after"]
	_, hasEvents := r["events"]
	switch {
	case hasOp && hasTable && (hasKey || hasAfter):
		return "a change event (op, table, key, after)"
	case hasOp && hasEvents:
		return "an envelope (op x: a source transaction's change events)"
	}
	return ""
}

// notARow is the bad_payload of change events or envelopes sent to a mode that reads rows.
func notARow(msg string) error {
	return errcode.New(errcode.BadPayload, msg,
		"set mode: cdc to apply change events such as pg_cdc writes; the input dead-letters this message after max_attempts")
}

// upsertMode inserts or updates on the key; repeated keys go in rounds (see folder).
type upsertMode struct{ w *writer }

func (u upsertMode) decode(m *Message, buf *rowBuf) (op, error) {
	vals, key, hasKey, err := u.w.rowFromPayload(m.Payload, m, buf)
	if err != nil {
		return op{}, err
	}
	if !hasKey {
		if !u.w.events {
			if what := changePayload(m.Payload); what != "" {
				return op{}, notARow(fmt.Sprintf("payload has no non-null value for key column(s) %v: it is %s, not a row", u.w.t.Key, what))
			}
		}
		return op{}, badPayload("payload has no non-null value for key column(s) %v", u.w.t.Key)
	}
	return op{msg: m, kind: opWrite, vals: vals, key: key, mapped: true}, nil
}

func (u upsertMode) plan(ops []op) ([]stmt, error) {
	f := newFolder(u.w, len(ops))
	for i := range ops {
		f.write(&ops[i])
	}
	return f.flush(nil)
}

// folder lays out the ops of a batch in rounds: round k holds the k-th op of every key, in offset
// order, so no statement meets the same key twice (no 21000) and every message's write really runs
// (a CHECK violated by one message is not hidden by a later message of the same key). With distinct
// keys, the usual case, a batch is one round: one set-based statement per column set.
type folder struct {
	w      *writer
	seen   map[string]int
	rounds [][]*op
}

// newFolder sizes the first round for n ops (with distinct keys, the only one).
func newFolder(w *writer, n int) *folder {
	return &folder{w: w, seen: make(map[string]int, n), rounds: [][]*op{make([]*op, 0, n)}}
}

func (f *folder) add(o *op) {
	r := f.seen[o.key]
	f.seen[o.key] = r + 1
	if r == len(f.rounds) {
		f.rounds = append(f.rounds, nil)
	}
	f.rounds[r] = append(f.rounds[r], o)
}

func (f *folder) write(o *op) { f.add(o) }

func (f *folder) del(o *op) { f.add(o) }

// flush appends the rounds' statements to stmts: inside a round, deletes first, then upserts by
// column set.
func (f *folder) flush(stmts []stmt) ([]stmt, error) {
	for _, round := range f.rounds {
		var dels [][]pgtype.Text
		rows := make([]rowVals, 0, len(round))
		for _, o := range round {
			if o.kind == opDelete {
				dels = append(dels, o.oldKey)
				continue
			}
			if o.mapped {
				rows = append(rows, o.vals)
				continue
			}
			rv, err := f.w.rowFrom(o.row, o.msg)
			if err != nil {
				return nil, err
			}
			if o.vals.stored {
				rv.onlyOverStored()
			}
			rows = append(rows, rv)
		}
		if len(dels) > 0 {
			stmts = append(stmts, f.w.deleteStmt(dels))
		}
		stmts = append(stmts, f.w.insertStmts(rows, true)...)
	}
	f.seen, f.rounds = map[string]int{}, nil
	return stmts, nil
}

// cdcMode applies change events (DESIGN §2): c/r/u upsert `after` (absent and `unchanged` columns
// keep their value; a `c` listing unchanged columns only over a stored row, see onlyOverStored), a
// key change moves the row, d deletes by key, t truncates, m is ignored, and an envelope (x)
// applies its events in order.
type cdcMode struct {
	w      *writer
	tables *tableWatch // a sink of one table: the event tables it meets (nil: not read)
}

// tableRead is how a change event's table is read.
type tableRead uint8

const (
	tableSkipped  tableRead = iota // not read (a sink of one table)
	tableNoted                     // read when it is a string, for a sink of one table's watch; else left out
	tableRequired                  // read, a string or null (with tables: the event's target depends on it)
)

// event is the part of a change event the sink reads.
type event struct {
	Op        string
	Table     []byte          // the table's name (as tableRead says), in the payload's bytes when unescaped
	KeyRaw    json.RawMessage // null, or an object (see key)
	After     json.RawMessage
	Before    json.RawMessage
	Unchanged []string
	Events    json.RawMessage // x: the envelope's change events
}

// key is the event's key object as a row (nil for null).
func (ev *event) key() (Row, error) {
	if isNull(ev.KeyRaw) {
		return nil, nil
	}
	return decodeObject(ev.KeyRaw)
}

// readEvent reads a change event's members by their exact names (DESIGN §2): op a string, key null
// or an object, unchanged null or an array of strings; after and before are read by the op.
// Table is read as table says: a sink of one table does not check it. One pass over the payload,
// keeping the members' bytes (a member named twice: the last); no map.
func readEvent(payload []byte, table tableRead) (event, error) {
	t, err := objectBytes(payload)
	if err != nil {
		return event{}, err
	}
	var r eventReader
	err = scanMembers(t, func(k []byte, _ bool, v []byte) error { return r.member(k, v) })
	if err != nil {
		return event{}, badPayload("payload is not valid JSON (%v): %s", err, excerpt(t))
	}
	return r.finish(table)
}

// readEventAt is readEvent for the event object at b[i] (an envelope's), returning where it ends;
// an error that is not bad_payload means b is not JSON there.
func readEventAt(b []byte, i int, table tableRead) (event, int, error) {
	var r eventReader
	end, err := jsonscan.MembersAt(b, i, func(k []byte, _ bool, v0 int) (int, error) {
		v1, err := jsonscan.SkipAt(b, v0)
		if err == nil {
			err = r.member(k, b[v0:v1])
		}
		return v1, err
	})
	if err != nil {
		return event{}, end, err // not JSON: the caller's document is refused whole
	}
	ev, err := r.finish(table)
	return ev, end, err
}

// eventReader collects a change event's members as they are read.
type eventReader struct {
	ev                            event
	opRaw, tableRaw, unchangedRaw json.RawMessage
}

// member takes the member named k (as written) with value v.
func (r *eventReader) member(k, v []byte) error {
	name, err := jsonscan.Text(k)
	if err != nil {
		return err
	}
	switch string(name) {
	case "op":
		r.opRaw = v
	case "table":
		r.tableRaw = v
	case "key":
		r.ev.KeyRaw = v
	case "after":
		r.ev.After = v
	case "before":
		r.ev.Before = v
	case "unchanged":
		r.unchangedRaw = v
	case "events":
		r.ev.Events = v
	}
	return nil
}

// finish checks the members' types and returns the event.
func (r *eventReader) finish(table tableRead) (event, error) {
	ev, opRaw, tableRaw, unchangedRaw := r.ev, r.opRaw, r.tableRaw, r.unchangedRaw
	if !isNull(opRaw) {
		if opRaw[0] != '"' {
			return ev, badPayload("change event op is not a string: %s", excerpt(opRaw))
		}
		if len(opRaw) == 3 && opRaw[1] != '\\' {
			ev.Op = string(opRaw[1:2]) // a one-byte string allocates nothing
		} else {
			op, err := textOf(opRaw)
			if err != nil {
				return ev, badPayload("change event op: %v", err)
			}
			ev.Op = op.String
		}
	}
	if table != tableSkipped && !isNull(tableRaw) {
		name, err := jsonscan.Text(tableRaw)
		switch {
		case err == nil:
			ev.Table = name
		case table == tableRequired:
			return ev, badPayload("change event table is not a string: %s", excerpt(tableRaw))
		}
	}
	if !isNull(ev.KeyRaw) && ev.KeyRaw[0] != '{' { // the scan checked it is valid JSON
		return ev, badPayload("change event key is not an object: %s", excerpt(ev.KeyRaw))
	}
	if !isNull(unchangedRaw) {
		var unchanged []string // not into ev: its address would move every event to the heap
		if err := json.Unmarshal(unchangedRaw, &unchanged); err != nil {
			return ev, badPayload("change event unchanged is not an array of column names: %s", excerpt(unchangedRaw))
		}
		ev.Unchanged = unchanged
	}
	return ev, nil
}

func (c cdcMode) decode(m *Message, buf *rowBuf) (op, error) {
	var ev event
	table := tableSkipped
	if c.tables != nil {
		table = tableNoted
	}
	o, env, err := readChange(m, table, &ev, func(ev *event) (op, error) { return c.decodeEvent(m, ev, buf) })
	if env || err != nil {
		return o, err
	}
	return c.decodeEvent(m, &ev, buf)
}

// decodeEvent turns a read change event into its op; buf is the batch's row memory (nil: none).
func (c cdcMode) decodeEvent(m *Message, ev *event, buf *rowBuf) (op, error) {
	if c.tables != nil && len(ev.Table) > 0 {
		c.tables.saw(ev.Table)
	}
	switch ev.Op {
	case "c", "r", "u":
		if o, ok := c.decodeWhole(m, ev, buf); ok {
			return o, nil
		}
		return c.decodeWrite(m, ev)
	case "d":
		return c.decodeDelete(m, ev)
	case "t":
		return op{msg: m, kind: opTruncate}, nil
	case "m":
		return op{msg: m, kind: opNone}, nil
	case "":
		return op{}, errcode.New(errcode.BadPayload, "change event has no op (DESIGN §2 needs op, table, key, after, ...)",
			"if the queue holds rows rather than change events, set mode: upsert (or append); else fix the producer. The input dead-letters this message after max_attempts")
	}
	return op{}, badPayload("unknown change event op %q (expected c, r, u, d, t, m or x)", ev.Op)
}

// decodeWhole is decodeWrite's hot path, for an event that does not move a row (no before, or a
// before with the same key: REPLICA IDENTITY FULL): after is mapped straight from its bytes, as an
// upsert payload is (no map of it is built). Columns listed in unchanged are absent from after
// (DESIGN §2), so they are left out as decodeWrite leaves them. ok is false when the event needs
// decodeWrite: an after that is not an object, lacks a key value (the key object fills it there)
// or names a column unchanged lists (decodeWrite drops it), a before that is not an object or
// holds another key (a move), or a key with no column under unknown_keys: pause (decodeWrite
// names such keys sorted).
func (c cdcMode) decodeWhole(m *Message, ev *event, buf *rowBuf) (op, bool) {
	if len(ev.After) == 0 || ev.After[0] != '{' || !isNull(ev.Before) && (ev.Op != "u" || ev.Before[0] != '{') {
		return op{}, false
	}
	if buf == nil {
		buf = &rowBuf{rows: 1}
	}
	vals, key, hasKey, err := c.w.rowFromPayload(ev.After, m, buf)
	if err != nil || !hasKey {
		return op{}, false
	}
	for _, u := range ev.Unchanged {
		if i, ok := c.w.t.byName[u]; ok && buf.spans[i].v1 > 0 {
			return op{}, false
		}
	}
	if !isNull(ev.Before) {
		if old, ok := c.w.keyTextOfObject(ev.Before); ok && old != key {
			return op{}, false // a key change: decodeWrite makes it a move
		}
	}
	if ev.Op == "c" && len(ev.Unchanged) > 0 {
		vals.onlyOverStored()
	}
	return op{msg: m, kind: opWrite, vals: vals, key: key, mapped: true}, true
}

// decodeDelete deletes by the event's key object, or by its before when the key is null or empty;
// the key columns are read from the object in one pass, without a map.
func (c cdcMode) decodeDelete(m *Message, ev *event) (op, error) {
	key, text, members, err := c.w.keyValuesOfObject(ev.KeyRaw)
	if members == 0 && !isNull(ev.Before) && ev.Before[0] == '{' {
		key, text, _, err = c.w.keyValuesOfObject(ev.Before)
	}
	if err != nil {
		return op{}, badPayload("delete event: %v", err)
	}
	return op{msg: m, kind: opDelete, oldKey: key, key: text}, nil
}

func (c cdcMode) decodeWrite(m *Message, ev *event) (op, error) {
	if isNull(ev.After) {
		return op{}, badPayload("%s event without an after object", ev.Op)
	}
	after, err := decodeObject(ev.After)
	if err != nil {
		return op{}, badPayload("%s event: after: %v", ev.Op, err)
	}
	if c.w.keys != nil {
		var pauseKeys []string
		for k := range after {
			if _, ok := c.w.t.byName[k]; !ok && c.w.keys.meet([]byte(k)) {
				pauseKeys = append(pauseKeys, k)
			}
		}
		if pauseKeys != nil {
			slices.Sort(pauseKeys)
			return op{}, c.w.keys.pauseError(pauseKeys)
		}
	}
	for _, u := range ev.Unchanged {
		delete(after, u)
	}
	keyRow, err := ev.key()
	if err != nil {
		return op{}, badPayload("change event key is not an object: %s", excerpt(ev.KeyRaw))
	}
	for k, v := range keyRow {
		if _, ok := after[k]; !ok {
			after[k] = v
		}
	}
	key, ok := c.w.keyText(after)
	if !ok {
		return op{}, badPayload("%s event has no non-null value for key column(s) %v", ev.Op, c.w.t.Key)
	}
	o := op{msg: m, kind: opWrite, row: after, key: key}
	o.vals.stored = ev.Op == "c" && len(ev.Unchanged) > 0 // flush makes its row so (onlyOverStored)
	if ev.Op != "u" || isNull(ev.Before) {
		return o, nil
	}
	before, err := decodeObject(ev.Before)
	if err != nil {
		return op{}, badPayload("u event: before: %v", err)
	}
	oldText, ok := c.w.keyText(before)
	if !ok || oldText == key {
		return o, nil
	}
	if o.oldKey, err = c.w.keyValues(before); err != nil {
		return op{}, err
	}
	if o.newKey, err = c.w.keyValues(after); err != nil {
		return op{}, err
	}
	o.kind = opMove
	return o, nil
}

func (c cdcMode) plan(ops []op) ([]stmt, error) {
	ops = flat(ops)
	f := newFolder(c.w, len(ops))
	var stmts []stmt
	var err error
	for i := range ops {
		o := &ops[i]
		switch o.kind {
		case opWrite:
			f.write(o)
		case opDelete:
			f.del(o)
		case opMove, opTruncate:
			if stmts, err = f.flush(stmts); err != nil {
				return nil, err
			}
			if o.kind == opTruncate {
				stmts = append(stmts, stmt{sql: "TRUNCATE " + c.w.t.Ident()})
				continue
			}
			stmts = append(stmts, c.w.moveStmt(o.oldKey, o.newKey))
			f.write(o)
		}
	}
	return f.flush(stmts)
}

// sqlMode runs the user's statement (or statements, split at their semicolons: sqlscript.go)
// once per message with params as text.
type sqlMode struct {
	parts    []sqlPart
	params   []param
	needJSON bool
}

func newSQLMode(statement string, paths []string) (*sqlMode, error) {
	if err := checkParamCount(statement, paths); err != nil {
		return nil, err
	}
	s := &sqlMode{parts: splitStatement(statement)}
	for _, p := range paths {
		pp, _ := newParam(p)
		s.params = append(s.params, pp)
		s.needJSON = s.needJSON || pp.needsJSON()
	}
	return s, nil
}

func (s *sqlMode) decode(m *Message, _ *rowBuf) (op, error) {
	doc := json.RawMessage(bytes.TrimSpace(m.Payload))
	if s.needJSON {
		if err := jsonscan.Value(doc); err != nil {
			return op{}, badPayload("payload is not valid JSON (%v), but params read paths inside it: %s", err, excerpt(doc))
		}
	}
	args := make([]any, len(s.params))
	for i, p := range s.params {
		v, err := p.value(m, doc)
		if err != nil {
			return op{}, err
		}
		args[i] = v
	}
	return op{msg: m, kind: opSQL, params: args}, nil
}

func (s *sqlMode) plan(ops []op) ([]stmt, error) {
	stmts := make([]stmt, 0, len(ops)*len(s.parts))
	for i := range ops {
		for _, p := range s.parts {
			stmts = append(stmts, stmt{sql: p.sql, args: p.args(ops[i].params)})
		}
	}
	return stmts, nil
}
