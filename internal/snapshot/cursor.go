package snapshot

// Cursor is where a snapshot stands, as the pointer carries it (DESIGN §3: snapshot{tables, table,
// after, rows}). It moves only inside the atomic write of the chunk's events, so a crash repeats at
// most one chunk.
type Cursor struct {
	Tables []string `json:"tables"` // every table of the snapshot, in order ("schema.name")
	Table  string   `json:"table"`  // the table being read
	After  []string `json:"after"`  // key values of the last row read; null at the table's start
	Rows   int64    `json:"rows"`   // rows read so far in this table
}

// Start is the cursor of a new snapshot of tables; false when there is nothing to read.
func Start(tables []string) (Cursor, bool) {
	if len(tables) == 0 {
		return Cursor{}, false
	}
	return Cursor{Tables: tables, Table: tables[0]}, true
}

// Append returns c with tables added at the end of its list (those not already in it), so a
// running snapshot also reads tables configured since it started.
func (c Cursor) Append(tables []string) Cursor {
	have := make(map[string]bool, len(c.Tables))
	for _, t := range c.Tables {
		have[t] = true
	}
	out := append([]string(nil), c.Tables...)
	for _, t := range tables {
		if !have[t] {
			have[t] = true
			out = append(out, t)
		}
	}
	c.Tables = out
	return c
}

// Again returns c with tables (added to the configuration since the last start) read again from
// their start: one the snapshot already read (before c.Table in the list) moves to the end of the
// list, the table being read starts over, and one not in the list is appended (as Append does).
// Its changes while it was not configured were not streamed, so what was read of it is stale.
func (c Cursor) Again(tables []string) Cursor {
	at := -1
	for i, t := range c.Tables {
		if t == c.Table {
			at = i
		}
	}
	again := make(map[string]bool, len(tables))
	for _, t := range tables {
		again[t] = true
	}
	out := make([]string, 0, len(c.Tables)+len(tables))
	var moved []string
	for i, t := range c.Tables {
		if i < at && again[t] {
			moved = append(moved, t)
			continue
		}
		out = append(out, t)
	}
	if again[c.Table] {
		c.After, c.Rows = nil, 0
	}
	c.Tables = out
	return c.Append(append(moved, tables...))
}

// Advance moves the cursor past a chunk of n rows whose last key is lastKey; a short chunk
// (n < limit) finishes the table and moves to the next. done is true after the last table.
func (c Cursor) Advance(n int, lastKey []string, limit int) (next Cursor, done bool) {
	if n >= limit && lastKey != nil {
		next = c
		next.After = lastKey
		next.Rows = c.Rows + int64(n)
		return next, false
	}
	for i, t := range c.Tables {
		if t == c.Table && i+1 < len(c.Tables) {
			return Cursor{Tables: c.Tables, Table: c.Tables[i+1]}, false
		}
	}
	return Cursor{}, true
}
