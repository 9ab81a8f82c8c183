package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// Tables that rejoin the publications. pgoutput sends nothing of a table that is in none of the
// source's publications (ALTER PUBLICATION … DROP TABLE, DROP COLUMN … CASCADE of a listed column,
// a dropped publication), so a table the stored pointer streams that a start finds out of them
// missed its changes since it left. The start puts it back (a managed publication) and reads it
// again, as a table added to `tables` (PlanTables). Putting it back erases the only sign that it
// was out, so before the publications change the start records the tables in the rejoin key,
// with the stored pointer's pos: until a pointer above that pos is written (the session's first
// write stores the plan that reads them again), every start reads them again.

// rejoinMark is the rejoin key's value.
type rejoinMark struct {
	Pos    string   `json:"pos"`    // the stored pointer's pos when the tables were found out
	Tables []string `json:"tables"` // "schema.name"
}

// markRejoin finds the tables the stored pointer streams that are in none of the publications, or
// that an earlier start found so and whose re-read no pointer stored yet, and records them in the
// rejoin key before the publications change. A stored pointer that cannot be read is left to
// startPointer (pointer_corrupt).
func (s *Source) markRejoin(ctx context.Context, q queryer, tables []TableInfo, version int) ([]string, error) {
	ptr, err := s.readPointer(ctx)
	if err != nil || ptr == nil {
		return nil, nil
	}
	var mark rejoinMark
	raw, err := s.rdb.Get(ctx, s.keys.Rejoin).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", s.keys.Rejoin, err)
	case json.Unmarshal(raw, &mark) != nil || ptr.Pos > mark.Pos: // stored since: done
		mark = rejoinMark{}
		if err := s.rdb.Del(ctx, s.keys.Rejoin).Err(); err != nil {
			return nil, fmt.Errorf("delete %s: %w", s.keys.Rejoin, err)
		}
	}
	out, err := outOfPublications(ctx, q, []string{s.cfg.Publication, s.cfg.InsertPublication}, tables, version)
	if err != nil {
		return nil, err
	}
	found := mark.Tables
	for _, t := range out {
		if slices.Contains(ptr.Tables, t) && !slices.Contains(found, t) {
			found = append(found, t)
		}
	}
	if len(found) == 0 || len(found) == len(mark.Tables) {
		return found, nil
	}
	b, _ := json.Marshal(rejoinMark{Pos: ptr.Pos, Tables: found})
	if err := s.rdb.Set(ctx, s.keys.Rejoin, b, 0).Err(); err != nil {
		return nil, fmt.Errorf("write %s: %w", s.keys.Rejoin, err)
	}
	return found, nil
}

// rejoin makes the start pointer read the marked tables again (PlanTables sees them as added),
// unless this start wrote the pointer itself (a first start or a resync: it missed nothing, and
// the mark is dropped). It returns the tables read again.
func (s *Source) rejoin(ctx context.Context, start pointer.Pointer, written bool, marked []string) (pointer.Pointer, []string, error) {
	if written {
		if len(marked) > 0 {
			if err := s.rdb.Del(ctx, s.keys.Rejoin).Err(); err != nil {
				return start, nil, fmt.Errorf("delete %s: %w", s.keys.Rejoin, err)
			}
		}
		return start, nil, nil
	}
	var again []string
	for _, t := range marked {
		if slices.Contains(start.Tables, t) && slices.Contains(s.tableNames(), t) {
			again = append(again, t)
		}
	}
	if len(again) == 0 {
		return start, nil, nil
	}
	start.Tables = slices.DeleteFunc(slices.Clone(start.Tables), func(t string) bool { return slices.Contains(again, t) })
	what := "snapshotted again while streaming"
	if !s.cfg.SnapshotInitial {
		what = "with snapshot: never not copied again (pgrelay resync copies every table)"
	}
	if s.hooks.Error != nil { // counted like the session error that ends a stream on it
		s.hooks.Error(string(errcode.Publication))
	}
	s.log.Warnf("table(s) %s were in no publication of this source since the pointer was written, so PostgreSQL did not send their changes since they left (ALTER PUBLICATION, or DROP COLUMN … CASCADE of a listed column); put back, and %s",
		strings.Join(again, ", "), what)
	return start, again, nil
}

// outOfPublications lists the tables that none of pubs publishes (all of them when none exists):
// listed by name, by their schema (FOR TABLES IN SCHEMA) or as FOR ALL TABLES.
func outOfPublications(ctx context.Context, q queryer, pubs []string, tables []TableInfo, version int) ([]string, error) {
	scopes := make([]pubScope, 0, len(pubs))
	for _, p := range pubs {
		sc, err := readPublication(ctx, q, p, version)
		if err != nil {
			return nil, err
		}
		scopes = append(scopes, sc)
	}
	var out []string
	for _, t := range tables {
		r := newPubRel(t.Schema, t.Name, nil)
		if !slices.ContainsFunc(scopes, func(sc pubScope) bool { held, _, _ := sc.holds(r); return held }) {
			out = append(out, t.Full())
		}
	}
	return out, nil
}
