package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// writer builds the set-based statements for one shape of the target table and caches their SQL
// per column set; pgx prepares each distinct SQL text once per connection (statement cache).
type writer struct {
	t        *Target
	meta     []string   // per column index: the metadata field it is filled from (partition, shard, ...), or ""
	keyIdx   []int      // column indexes of t.Key
	colSig   []string   // "i," per column, the pieces of a column-set signature
	bin      []binField // per column index: its COPY binary encoder, or nil (see copy.go)
	stream   *streamGate
	keys     *unknownKeys // payload keys that name no column (nil: left out silently)
	events   bool         // the table has an op, after or events column: a change event may be a row of it
	rowsOnly bool         // neither events nor a column for the whole payload: a change event is no row for it
	mu       sync.Mutex
	sqlByID  map[string]string
}

// rowVals is one row to write: the target columns it names (ascending index) and their texts.
type rowVals struct {
	cols   []int
	vals   []pgtype.Text
	sig    string // the column set, as "i,j,k" (and storedOnlySig when stored)
	stored bool   // written only over a stored row of its key (see onlyOverStored)
}

// storedOnlySig ends the signature of a column set written only over stored rows: its statement
// differs from the same set's upsert.
const storedOnlySig = "|stored"

// onlyOverStored makes rv a row written only where its key has a stored row (an update of the
// columns it names), never inserted: a cdc `c` that lists unchanged columns, pg_cdc's key change
// whose new row was gone when its values were read back, so its `d` follows and the values it
// lacks are known nowhere.
func (rv *rowVals) onlyOverStored() {
	if !rv.stored {
		rv.stored, rv.sig = true, rv.sig+storedOnlySig
	}
}

// stmt is one statement of a batch.
type stmt struct {
	sql  string
	args []any
}

func newWriter(t *Target, mc MetadataColumns) *writer {
	w := &writer{t: t, meta: make([]string, len(t.Columns)), sqlByID: map[string]string{}}
	for field, name := range map[string]string{"partition": mc.Partition, "shard": mc.Shard, "offset": mc.Offset,
		"message_id": mc.MessageID, "transaction_id": mc.TransactionID, "created_at": mc.CreatedAt, "payload": mc.Payload} {
		if name != "" {
			w.meta[t.byName[name]] = field
		}
	}
	for _, k := range t.Key {
		w.keyIdx = append(w.keyIdx, t.byName[k])
	}
	for i := range t.Columns {
		w.colSig = append(w.colSig, strconv.Itoa(i)+",")
		w.bin = append(w.bin, binFieldFor(t.Columns[i].BaseType))
	}
	w.stream = &streamGate{}
	_, op := t.byName["op"]
	_, after := t.byName["after"]
	_, events := t.byName["events"]
	w.events = op || after || events
	w.rowsOnly = !w.events && mc.Payload == ""
	return w
}

// watching sets the watch of payload keys that name no column.
func (w *writer) watching(keys *unknownKeys) *writer {
	w.keys = keys
	return w
}

// rowFrom maps a payload object (plus metadata columns) onto the target: exact column names,
// unknown keys ignored, generated columns never written, absent keys left out of the column set.
func (w *writer) rowFrom(r Row, m *Message) (rowVals, error) {
	return w.mapRow(func(c *Column, _ int) (json.RawMessage, bool) { raw, ok := r[c.Name]; return raw, ok }, m)
}

// rowBuf holds the mapped rows of one batch (append and upsert): each row's column and value
// slices are cut from two shared slabs, and its values are substrings of one copy of the batch's
// payloads, so mapping a row whose strings hold no escapes allocates nothing. It belongs to one
// attempt; a nil *rowBuf works too (each row then gets its own memory).
type rowBuf struct {
	rows     int             // rows expected in the batch (sizes the slabs)
	text     strings.Builder // the payloads, appended one after another; bytes once written never change
	cols     []int
	vals     []pgtype.Text
	scratch  []byte // an escaped string's text before keep
	spans    []span // per target column: where the current payload's value is
	order    []int  // per member position: the column the previous payloads had there (-1: none)
	lastCols []int  // the previous row's column set and its signature, reused while rows agree
	lastSig  string
	hasLast  bool
}

// maxOrder bounds rowBuf.order: members past it are looked up by name.
const maxOrder = 256

// span is a value's position in its payload; v1 == 0 means the payload does not name the column.
type span struct{ v0, v1 int }

// newRowBuf sizes a rowBuf for msgs.
func newRowBuf(msgs []*Message) *rowBuf {
	total, rows := 0, len(msgs)
	for _, m := range msgs {
		if len(m.Payload) > MaxPayloadBytes {
			continue // refused before it is read (checkSize)
		}
		total += len(m.Payload)
		if isEnvelope(m.Payload) {
			rows += envelopeEvents(m.Payload) - 1
		}
	}
	b := &rowBuf{rows: rows}
	b.text.Grow(total)
	return b
}

// keep copies p into the batch's text and returns the copy as a string that stays valid: a
// strings.Builder only appends, so a string it returned is never overwritten.
func (b *rowBuf) keep(p []byte) string {
	start := b.text.Len()
	b.text.Write(p)
	return b.text.String()[start:]
}

// sigOf is the signature of cols, computed once per run of rows with the same column set.
func (b *rowBuf) sigOf(w *writer, cols []int) string {
	if b.hasLast && slices.Equal(cols, b.lastCols) {
		return b.lastSig
	}
	var sig strings.Builder
	sig.Grow(4 * len(cols))
	for _, i := range cols {
		sig.WriteString(w.colSig[i])
	}
	b.lastCols, b.lastSig, b.hasLast = cols, sig.String(), true
	return b.lastSig
}

// rowFromPayload is rowFrom straight from the payload bytes (append and upsert's hot path: no map
// of the payload is built, values are substrings of buf's copy of the payload); key is the fold
// identity of the key columns ("" if one is missing or null). A change event or an envelope as
// pg_cdc writes them (op first) is refused as what it is where the table has no op, after or
// events column and the payload is not kept whole (metadata payload): its members would be taken
// for columns (an envelope's id for an id column's value).
func (w *writer) rowFromPayload(payload []byte, m *Message, buf *rowBuf) (rv rowVals, key string, hasKey bool, err error) {
	if w.rowsOnly && bytes.HasPrefix(payload, []byte(eventHead)) {
		if what := changePayload(payload); what != "" {
			return rv, "", false, notARow("payload is " + what + ", not a row")
		}
	}
	t, err := objectBytes(payload)
	if err != nil {
		return rv, "", false, err
	}
	if buf == nil {
		buf = &rowBuf{rows: 1}
	}
	n := len(w.t.Columns)
	if len(buf.spans) != n {
		buf.spans = make([]span, n)
	}
	spans := buf.spans
	clear(spans)
	member := 0
	var pauseKeys []string // unknown_keys: pause
	err = jsonscan.Members(t, func(k []byte, escaped bool, v0, v1 int) error {
		j := member
		member++
		var i int
		var ok bool
		if escaped {
			var name string
			if err := json.Unmarshal(k, &name); err != nil {
				return err
			}
			if i, ok = w.t.byName[name]; !ok && w.keys.meet([]byte(name)) {
				pauseKeys = append(pauseKeys, name)
			}
		} else if name := k[1 : len(k)-1]; j < len(buf.order) && buf.order[j] >= 0 && w.t.Columns[buf.order[j]].Name == string(name) {
			i, ok = buf.order[j], true // producers write their keys in the same order: no map lookup
		} else if i, ok = w.t.byName[string(name)]; ok && j < maxOrder {
			for len(buf.order) <= j {
				buf.order = append(buf.order, -1)
			}
			buf.order[j] = i
		} else if !ok && w.keys.meet(name) {
			pauseKeys = append(pauseKeys, string(name))
		}
		if ok {
			spans[i] = span{v0, v1}
		}
		return nil
	})
	if err != nil {
		return rv, "", false, badPayload("payload is not valid JSON (%v): %s", err, excerpt(t))
	}
	if pauseKeys != nil {
		return rv, "", false, w.keys.pauseError(pauseKeys)
	}
	text := buf.keep(t)
	if buf.cols == nil {
		buf.cols, buf.vals = make([]int, 0, buf.rows*n), make([]pgtype.Text, 0, buf.rows*n)
	}
	start := len(buf.cols)
	for i := range w.t.Columns {
		c := &w.t.Columns[i]
		if c.Generated {
			continue
		}
		var v pgtype.Text
		if field := w.meta[i]; field != "" {
			v = metaValue(field, c, m)
		} else if sp := spans[i]; sp.v1 > 0 {
			if v, err = valueOf(c, text[sp.v0:sp.v1], buf); err != nil {
				return rv, "", false, err
			}
		} else {
			continue
		}
		buf.cols = append(buf.cols, i)
		buf.vals = append(buf.vals, v)
	}
	end := len(buf.cols)
	rv.cols, rv.vals = buf.cols[start:end:end], buf.vals[start:end:end]
	rv.sig = buf.sigOf(w, rv.cols)
	key, hasKey = w.keyFromSpans(text, spans, buf)
	return rv, key, hasKey, nil
}

// keyFromSpans is keyTextOf over a scanned payload: one key column's text is the identity itself
// (an empty string is a key like any other), several are joined with their lengths. ok is false
// when a key column is absent or null.
func (w *writer) keyFromSpans(text string, spans []span, buf *rowBuf) (key string, ok bool) {
	if len(w.keyIdx) == 1 {
		sp := spans[w.keyIdx[0]]
		if sp.v1 == 0 {
			return "", false
		}
		v, err := stringText(text[sp.v0:sp.v1], buf)
		if err != nil || !v.Valid {
			return "", false
		}
		return v.String, true
	}
	return w.keyTextOf(func(i int) (json.RawMessage, bool) {
		sp := spans[i]
		return json.RawMessage(text[sp.v0:sp.v1]), sp.v1 > 0
	})
}

// mapRow builds the row from get, which returns a column's payload value and whether it is named.
func (w *writer) mapRow(get func(c *Column, i int) (json.RawMessage, bool), m *Message) (rowVals, error) {
	n := len(w.t.Columns)
	rv := rowVals{cols: make([]int, 0, n), vals: make([]pgtype.Text, 0, n)}
	var sig strings.Builder
	sig.Grow(4 * n)
	for i := range w.t.Columns {
		c := &w.t.Columns[i]
		if c.Generated {
			continue
		}
		var v pgtype.Text
		if field := w.meta[i]; field != "" {
			v = metaValue(field, c, m)
		} else if raw, ok := get(c, i); ok {
			var err error
			if v, err = valueFor(c, raw); err != nil {
				return rv, err
			}
		} else {
			continue
		}
		rv.cols = append(rv.cols, i)
		rv.vals = append(rv.vals, v)
		sig.WriteString(w.colSig[i])
	}
	rv.sig = sig.String()
	return rv, nil
}

// metaValue is the text of a metadata column for message m.
func metaValue(field string, c *Column, m *Message) pgtype.Text {
	var s string
	switch field {
	case "partition":
		s = m.Partition
	case "message_id":
		s = m.MessageID
	case "transaction_id":
		if m.TransactionID == "" {
			return pgtype.Text{}
		}
		s = m.TransactionID
	case "shard":
		if !m.HasPosition {
			return pgtype.Text{}
		}
		s = strconv.Itoa(int(m.Shard))
	case "offset":
		if !m.HasPosition {
			return pgtype.Text{}
		}
		s = strconv.FormatInt(m.Offset, 10)
	case "created_at":
		if m.CreatedAt == 0 {
			return pgtype.Text{}
		}
		if c.Datetime {
			s = time.UnixMilli(m.CreatedAt).UTC().Format("2006-01-02T15:04:05.000Z07:00")
		} else {
			s = strconv.FormatInt(m.CreatedAt, 10)
		}
	case "payload":
		s = string(m.Payload)
	}
	return pgtype.Text{String: s, Valid: true}
}

// keyTextOfObject is keyText of a JSON object (a change event's before) read in one pass without
// a map; a member named twice counts once, the last, as in a map.
func (w *writer) keyTextOfObject(obj []byte) (string, bool) {
	raws, _, err := w.keyMembers(obj)
	if err != nil {
		return "", false
	}
	return w.keyTextOf(raws.get)
}

// keyValuesOfObject is keyValues and keyText of a JSON object (null: none) read as keyTextOfObject
// reads it; members is how many members the object has.
func (w *writer) keyValuesOfObject(obj []byte) (vals []pgtype.Text, text string, members int, err error) {
	raws, members, err := w.keyMembers(obj)
	if err != nil {
		return nil, "", 0, err
	}
	vals = make([]pgtype.Text, len(w.keyIdx))
	for n, i := range w.keyIdx {
		c := &w.t.Columns[i]
		if raw, ok := raws.get(i); !ok || isNull(raw) {
			return nil, "", members, badPayload("key column %q is missing or null", c.Name)
		} else if vals[n], err = valueFor(c, raw); err != nil {
			return nil, "", members, err
		}
	}
	text, _ = w.keyTextOf(raws.get)
	return vals, text, members, nil
}

// keyRaws are the values of a row's key columns, by column index (nil: not named).
type keyRaws map[int]json.RawMessage

func (k keyRaws) get(i int) (json.RawMessage, bool) { raw, ok := k[i]; return raw, ok }

// keyMembers reads the key columns' values from a JSON object (null: none), and how many members
// it has.
func (w *writer) keyMembers(obj []byte) (keyRaws, int, error) {
	raws := make(keyRaws, len(w.keyIdx))
	if isNull(obj) {
		return raws, 0, nil
	}
	members := 0
	err := jsonscan.Members(obj, func(k []byte, _ bool, v0, v1 int) error {
		members++
		name, err := jsonscan.Text(k)
		if err != nil {
			return err
		}
		for _, i := range w.keyIdx {
			if w.t.Columns[i].Name == string(name) {
				raws[i] = obj[v0:v1]
			}
		}
		return nil
	})
	return raws, members, err
}

// keyText identifies the row's key for folding, or ok=false when a key column is absent or null.
func (w *writer) keyText(r Row) (string, bool) {
	return w.keyTextOf(func(i int) (json.RawMessage, bool) { raw, ok := r[w.t.Columns[i].Name]; return raw, ok })
}

func (w *writer) keyTextOf(get func(i int) (json.RawMessage, bool)) (string, bool) {
	if len(w.keyIdx) == 1 { // the value itself, as keyFromSpans has it: the two must agree
		raw, ok := get(w.keyIdx[0])
		if !ok || isNull(raw) {
			return "", false
		}
		v, err := textOf(raw)
		return v.String, err == nil && v.Valid
	}
	var b strings.Builder
	for _, i := range w.keyIdx {
		raw, ok := get(i)
		if !ok || isNull(raw) {
			return "", false
		}
		v, err := textOf(raw)
		if err != nil || !v.Valid {
			return "", false
		}
		b.WriteString(strconv.Itoa(len(v.String)))
		b.WriteByte(':')
		b.WriteString(v.String)
	}
	return b.String(), true
}

// expr is the SQL that turns the text src into a value of column i.
func (w *writer) expr(i int, src string) string {
	c := &w.t.Columns[i]
	if c.Kind == kindPopulate {
		return fmt.Sprintf("(jsonb_populate_record(NULL::%s, jsonb_build_object(%s, %s::jsonb))).%s",
			w.t.Ident(), quoteLiteral(c.Name), src, pgx.Identifier{c.Name}.Sanitize())
	}
	return src + "::" + c.CastType
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (w *writer) colName(i int) string { return pgx.Identifier{w.t.Columns[i].Name}.Sanitize() }

func (w *writer) isKey(i int) bool {
	for _, k := range w.keyIdx {
		if k == i {
			return true
		}
	}
	return false
}

// cached returns the SQL for id, building it once.
func (w *writer) cached(id string, build func() string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.sqlByID[id]; ok {
		return s
	}
	s := build()
	w.sqlByID[id] = s
	return s
}

// insertSQL is INSERT ... SELECT FROM unnest(text arrays) for one column set, with ON CONFLICT on
// the key for upserts: present non-key columns are updated, absent ones keep their stored value.
// PostgreSQL checks NOT NULL on the row an upsert would insert before it looks for the conflict,
// so an upsert whose set leaves out a required column (NOT NULL, no default: say an unchanged
// TOASTed value of a cdc u) reads it from the stored row (LEFT JOIN on the key) into the row to
// insert: for a stored row it passes the check and is not updated; without one it is NULL, and the
// insert fails as it would have. Rows written only over stored rows (stored) join the stored row
// (inner JOIN): without one there is nothing to insert.
func (w *writer) insertSQL(cols []int, upsert, stored bool) string {
	if len(cols) == 0 {
		return "INSERT INTO " + w.t.Ident() + " SELECT FROM generate_series(1, $1::int)"
	}
	var names, exprs, params, aliases, sets []string
	overriding := ""
	for n, i := range cols {
		alias := "c" + strconv.Itoa(n)
		names = append(names, w.colName(i))
		exprs = append(exprs, w.expr(i, "u."+alias))
		params = append(params, "$"+strconv.Itoa(n+1)+"::text[]")
		aliases = append(aliases, alias)
		c := &w.t.Columns[i]
		if c.IdentityAlways {
			overriding = " OVERRIDING SYSTEM VALUE"
		} else if upsert && !w.isKey(i) {
			sets = append(sets, w.colName(i)+" = EXCLUDED."+w.colName(i))
		}
	}
	from := " FROM unnest(" + strings.Join(params, ", ") + ") AS u(" + strings.Join(aliases, ", ") + ")"
	if upsert {
		var on []string
		for n, i := range cols {
			if w.isKey(i) {
				on = append(on, "s."+w.colName(i)+" = "+exprs[n])
			}
		}
		joined := false
		for i := range w.t.Columns {
			if c := &w.t.Columns[i]; c.Required && !slices.Contains(cols, i) && len(on) == len(w.keyIdx) {
				names = append(names, w.colName(i))
				exprs = append(exprs, "s."+w.colName(i))
				joined = true
			}
		}
		switch {
		case stored && len(on) == len(w.keyIdx):
			from += " JOIN " + w.t.Ident() + " AS s ON " + strings.Join(on, " AND ")
		case joined:
			from += " LEFT JOIN " + w.t.Ident() + " AS s ON " + strings.Join(on, " AND ")
		}
	}
	sql := "INSERT INTO " + w.t.Ident() + " (" + strings.Join(names, ", ") + ")" + overriding +
		" SELECT " + strings.Join(exprs, ", ") + from
	if !upsert {
		return sql
	}
	var keys []string
	for _, i := range w.keyIdx {
		keys = append(keys, w.colName(i))
	}
	sql += " ON CONFLICT (" + strings.Join(keys, ", ") + ")"
	if len(sets) == 0 {
		return sql + " DO NOTHING"
	}
	return sql + " DO UPDATE SET " + strings.Join(sets, ", ")
}

// insertStmts groups rows by column set (first appearance order) into one statement per set.
func (w *writer) insertStmts(rows []rowVals, upsert bool) []stmt {
	groups := [][]rowVals{rows}
	for _, r := range rows {
		if r.sig != rows[0].sig {
			groups = groupBySig(rows)
			break
		}
	}
	out := make([]stmt, 0, len(groups))
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		cols := g[0].cols
		id := "i:" + g[0].sig
		if upsert {
			id = "u:" + g[0].sig
		}
		stored := g[0].stored
		sql := w.cached(id, func() string { return w.insertSQL(cols, upsert, stored) })
		if len(cols) == 0 {
			out = append(out, stmt{sql: sql, args: []any{len(g)}})
			continue
		}
		args := make([]any, len(cols))
		for n := range cols {
			args[n] = rowsColumn{rows: g, n: n}
		}
		out = append(out, stmt{sql: sql, args: args})
	}
	return out
}

// groupBySig splits rows by column set, in order of first appearance.
func groupBySig(rows []rowVals) [][]rowVals {
	var groups [][]rowVals
	at := map[string]int{}
	for _, r := range rows {
		i, ok := at[r.sig]
		if !ok {
			i = len(groups)
			at[r.sig] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups
}

// deleteStmt deletes the rows whose keys are given (one text per key column per row).
func (w *writer) deleteStmt(keys [][]pgtype.Text) stmt {
	sql := w.cached("d", func() string {
		var params, aliases, conds []string
		for n, i := range w.keyIdx {
			alias := "k" + strconv.Itoa(n)
			params = append(params, "$"+strconv.Itoa(n+1)+"::text[]")
			aliases = append(aliases, alias)
			conds = append(conds, "t."+w.colName(i)+" = "+w.expr(i, "u."+alias))
		}
		return "DELETE FROM " + w.t.Ident() + " AS t USING unnest(" + strings.Join(params, ", ") + ") AS u(" +
			strings.Join(aliases, ", ") + ") WHERE " + strings.Join(conds, " AND ")
	})
	args := make([]any, len(w.keyIdx))
	for n := range w.keyIdx {
		arr := make(textArray, len(keys))
		for j, k := range keys {
			arr[j] = k[n]
		}
		args[n] = arr
	}
	return stmt{sql: sql, args: args}
}

// moveStmt changes a row's key from old to new in place (cdc key change), keeping its other columns.
func (w *writer) moveStmt(oldKey, newKey []pgtype.Text) stmt {
	sql := w.cached("m", func() string {
		var sets, conds []string
		n := len(w.keyIdx)
		for j, i := range w.keyIdx {
			sets = append(sets, w.colName(i)+" = "+w.expr(i, "$"+strconv.Itoa(j+1)+"::text"))
			conds = append(conds, w.colName(i)+" = "+w.expr(i, "$"+strconv.Itoa(n+j+1)+"::text"))
		}
		return "UPDATE " + w.t.Ident() + " SET " + strings.Join(sets, ", ") + " WHERE " + strings.Join(conds, " AND ")
	})
	args := make([]any, 0, 2*len(newKey))
	for _, v := range newKey {
		args = append(args, v)
	}
	for _, v := range oldKey {
		args = append(args, v)
	}
	return stmt{sql: sql, args: args}
}

// keyValues extracts the key columns' texts from r (nil when absent or null).
func (w *writer) keyValues(r Row) ([]pgtype.Text, error) {
	out := make([]pgtype.Text, len(w.keyIdx))
	for n, i := range w.keyIdx {
		c := &w.t.Columns[i]
		raw, ok := r[c.Name]
		if !ok || isNull(raw) {
			return nil, badPayload("key column %q is missing or null", c.Name)
		}
		v, err := valueFor(c, raw)
		if err != nil {
			return nil, err
		}
		out[n] = v
	}
	return out, nil
}

// send runs stmts in one round trip (a pgx batch: one pipeline, one Sync) and returns the first
// error. After an error the server skips the statements that follow, a COMMIT among them included.
func send(ctx context.Context, conn *pgx.Conn, stmts []stmt) error {
	_, err := sendAt(ctx, conn, stmts)
	return err
}

// sendAt is send that also returns the index of the statement that failed.
func sendAt(ctx context.Context, conn *pgx.Conn, stmts []stmt) (int, error) {
	return sendAtMeanwhile(ctx, conn, stmts, nil)
}

// commitErr is err, the error of statement sql, saying so when that statement was the COMMIT.
func commitErr(sql string, err error) error {
	if sql == "COMMIT" {
		return fmt.Errorf("commit: %w", err)
	}
	return err
}

// sendAtMeanwhile is sendAt that runs meanwhile (if not nil) after the statements are sent and
// before their results are read, while PostgreSQL runs them (with no statements, at once).
func sendAtMeanwhile(ctx context.Context, conn *pgx.Conn, stmts []stmt, meanwhile func()) (int, error) {
	if len(stmts) == 0 {
		if meanwhile != nil {
			meanwhile()
		}
		return -1, nil
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(stmts))}
	for _, s := range stmts {
		b.Queue(s.sql, s.args...)
	}
	br := conn.SendBatch(ctx, b)
	if meanwhile != nil {
		meanwhile()
	}
	for i, s := range stmts {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return i, commitErr(s.sql, err)
		}
	}
	return -1, br.Close()
}
