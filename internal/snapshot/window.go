package snapshot

// Effect is what one committed stream change did to one row of the table being snapshotted, in
// the terms the filter needs.
type Effect struct {
	Key       string   // the row's key, rendered by the caller exactly as it renders chunk keys
	Put       bool     // insert, or the new row of a key change: every column is carried
	Delete    bool     // delete, or the old row of a key change
	Unchanged []string // for updates: columns PostgreSQL did not send (unchanged TOASTed values)
}

// Commit is one committed stream transaction's effects on the table being snapshotted.
type Commit struct {
	Xid      uint32
	Effects  []Effect
	Truncate bool // the transaction truncated the table: the whole chunk is dropped
}

// Window collects the stream's commits while one chunk is in flight. Open it before the low
// watermark is emitted (so commits decoded before the watermark, but perhaps invisible to the
// chunk's snapshot, are seen), mark the low watermark when the stream reaches it, and close it at
// the high watermark.
type Window struct {
	before  []Commit // decoded after the window opened, before the low watermark
	between []Commit // decoded between the watermarks
	inside  bool     // the low watermark was seen
}

// NewWindow opens a window.
func NewWindow() *Window { return &Window{} }

// LowWatermark records that the stream reached this chunk's low watermark.
func (w *Window) LowWatermark() { w.inside = true }

// Seen reports whether the low watermark was reached.
func (w *Window) Seen() bool { return w.inside }

// Observe records a committed stream transaction (only its effects on the table being read).
func (w *Window) Observe(c Commit) {
	if len(c.Effects) == 0 && !c.Truncate {
		return
	}
	if w.inside {
		w.between = append(w.between, c)
	} else {
		w.before = append(w.before, c)
	}
}

// Row is one row read by a chunk: its rendered key and its values by column.
type Row struct {
	Key    string
	Values map[string][]byte // output-function text; nil = NULL
}

// Fill restores columns a dropped row's stream events left unchanged: a `u` event with the key and
// these columns only, every other non-key column listed as unchanged.
type Fill struct {
	Row     Row
	Columns []string // the restored columns, in table order
}

// Resolve applies the DBLog rule to the rows of a chunk read under snap: it returns the surviving
// rows (in chunk order) and the fills for dropped rows. columns are the table's non-key columns in
// table order, used for the fills' column order.
func (w *Window) Resolve(rows []Row, snap Snapshot, columns []string) (survivors []Row, fills []Fill) {
	dropping := w.dropping(snap)
	if dropping == nil { // a truncate in the window: nothing of the chunk survives
		return nil, nil
	}
	for _, r := range rows {
		effects, dropped := dropping[r.Key]
		if !dropped {
			survivors = append(survivors, r)
			continue
		}
		if missing := unchangedThroughout(effects); len(missing) > 0 {
			var cols []string
			for _, c := range columns {
				if missing[c] {
					cols = append(cols, c)
				}
			}
			fills = append(fills, Fill{Row: r, Columns: cols})
		}
	}
	return survivors, fills
}

// dropping maps each key to drop to the effects (in commit order) that dropped it; nil means a
// truncate drops everything.
func (w *Window) dropping(snap Snapshot) map[string][]Effect {
	out := map[string][]Effect{}
	add := func(c Commit) bool {
		if c.Truncate {
			return false
		}
		for _, e := range c.Effects {
			out[e.Key] = append(out[e.Key], e)
		}
		return true
	}
	for _, c := range w.before {
		if !snap.Sees(c.Xid) && !add(c) {
			return nil
		}
	}
	for _, c := range w.between {
		if !add(c) {
			return nil
		}
	}
	return out
}

// unchangedThroughout replays a dropped row's effects: the columns no effect carried since the row
// last came into being are the ones a consumer starting from the snapshot lacks. A row that was
// (re)inserted, or that ends deleted, needs no fill.
func unchangedThroughout(effects []Effect) map[string]bool {
	var missing map[string]bool
	for _, e := range effects {
		switch {
		case e.Put:
			return nil
		case e.Delete:
			missing = nil
		case len(e.Unchanged) == 0:
			return nil
		default:
			next := map[string]bool{}
			for _, c := range e.Unchanged {
				if missing == nil || missing[c] {
					next[c] = true
				}
			}
			missing = next
		}
	}
	if len(effects) > 0 && effects[len(effects)-1].Delete {
		return nil
	}
	return missing
}

// Drops reports whether Resolve would drop any row of a chunk read under snap (some commit touches
// a key, or a truncate drops the chunk): when it does not, every row survives as read.
func (w *Window) Drops(snap Snapshot) bool {
	d := w.dropping(snap)
	return d == nil || len(d) > 0
}
