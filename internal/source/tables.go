package source

import (
	"encoding/json"
	"fmt"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// PlanTables brings the stored pointer p up to date with the configured tables. A table missing
// from p.Tables was added to `tables` since the pointer was written: with `snapshot: initial`
// (snapshotNew) it joins the snapshot — appended to the running one, or as a new snapshot of the
// added tables alone, in the same epoch (chunk numbers, and so ids, go on from where they are).
// A table removed from `tables` leaves p.Tables, so adding it back snapshots it again (its
// changes in between were not streamed). The result is only a plan: the first write of the
// session stores it, so a crash before that plans the same again.
func PlanTables(p pointer.Pointer, configured []string, snapshotNew bool) (pointer.Pointer, []string, error) {
	if p.Tables == nil { // a pointer from before the field: nothing counts as added
		p.Tables = configured
		return p, nil, nil
	}
	known := make(map[string]bool, len(p.Tables))
	for _, t := range p.Tables {
		known[t] = true
	}
	var added []string
	for _, t := range configured {
		if !known[t] {
			added = append(added, t)
		}
	}
	p.Tables = configured
	if len(added) == 0 || !snapshotNew {
		return p, added, nil
	}
	var cur snapshot.Cursor
	if p.SnapshotRuns() {
		if err := json.Unmarshal(p.Snapshot, &cur); err != nil || cur.Table == "" {
			return p, nil, fmt.Errorf("the pointer's snapshot cursor is unreadable: %s", p.Snapshot)
		}
		cur = cur.Again(added) // one already read, or being read, is read again from its start
	} else {
		cur, _ = snapshot.Start(added)
	}
	b, err := json.Marshal(cur)
	if err != nil {
		return p, nil, err
	}
	p.Snapshot = b
	return p, added, nil
}

// startCursor is the pointer's snapshot field for a new epoch: null unless `snapshot: initial`.
func (s *Source) startCursor() json.RawMessage {
	if !s.cfg.SnapshotInitial {
		return nil
	}
	return s.fullCursor()
}

// tableNames are the tables the session streams as "schema.name", in configuration order: the
// configured ones the start checks did not refuse.
func (s *Source) tableNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streamed
}

// fullCursor is the snapshot of every table (a resync always snapshots).
func (s *Source) fullCursor() json.RawMessage {
	cur, ok := snapshot.Start(s.tableNames())
	if !ok {
		return nil
	}
	b, _ := json.Marshal(cur)
	return b
}
