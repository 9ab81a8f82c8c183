package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Tables read again on request (`pgrelay snapshot`): a consumer rebuilt from the queue, a copy
// repaired, a table whose events a processor dropped. The request is the reread key; the owning
// replica's heartbeat sees it and ends the session, and the start after it reads the tables again
// while streaming, as tables added to `tables` (PlanTables), without a new epoch: the stream goes
// on where it was, the rows arrive as r events after the changes already in the queue. The start
// marks the request applied, with the pointer's pos it started from: once a pointer above that pos
// is stored (the session's first write stores the plan that reads the tables), the request is done;
// a start before that (the session killed first) applies it again.

// rereadMark is the reread key's value.
type rereadMark struct {
	Tables      []string `json:"tables"` // "schema.name"
	RequestedAt string   `json:"requested_at"`
	By          string   `json:"by"`
	AppliedPos  string   `json:"applied_pos,omitempty"` // the pos a start applied it from; "" until then
}

// errRereadRequested ends a streaming session when a re-read is requested. It is no failure: the
// next start follows at once.
var errRereadRequested = errors.New("a re-read of tables was requested (`pgrelay snapshot`)")

// rereadPending reports whether the reread key holds a request no start applied yet.
func (s *Source) rereadPending(ctx context.Context) bool {
	raw, err := s.rdb.Get(ctx, s.keys.Reread).Bytes()
	if err != nil {
		return false
	}
	var m rereadMark
	return json.Unmarshal(raw, &m) == nil && m.AppliedPos == "" && len(m.Tables) > 0
}

// applyRereadScript sets the reread key to ARGV[2] if it still holds ARGV[1] (a request written
// meanwhile is left for the next start).
var applyRereadScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0`)

// reread makes the start pointer read the requested tables again (PlanTables sees them as added)
// and returns them; a request already done, or made moot by a start that wrote the pointer itself
// (a first start or a resync: every table is read), is deleted.
func (s *Source) reread(ctx context.Context, start pointer.Pointer, written bool) (pointer.Pointer, []string, error) {
	raw, err := s.rdb.Get(ctx, s.keys.Reread).Result()
	if errors.Is(err, redis.Nil) {
		return start, nil, nil
	}
	if err != nil {
		return start, nil, fmt.Errorf("read %s: %w", s.keys.Reread, err)
	}
	var m rereadMark
	done := json.Unmarshal([]byte(raw), &m) != nil || written || m.AppliedPos != "" && start.Pos > m.AppliedPos
	if done {
		if err := s.rdb.Del(ctx, s.keys.Reread).Err(); err != nil {
			return start, nil, fmt.Errorf("delete %s: %w", s.keys.Reread, err)
		}
		return start, nil, nil
	}
	var again, gone []string
	streamed := s.tableNames()
	for _, t := range m.Tables {
		if slices.Contains(start.Tables, t) && slices.Contains(streamed, t) {
			again = append(again, t)
		} else {
			gone = append(gone, t)
		}
	}
	if len(gone) > 0 {
		s.log.Warnf("re-read requested of %s, which this source does not stream (no longer in tables, or refused): not read", strings.Join(gone, ", "))
	}
	if m.AppliedPos == "" {
		m.AppliedPos = start.Pos
		b, _ := json.Marshal(m)
		if n, err := applyRereadScript.Run(ctx, s.rdb, []string{s.keys.Reread}, raw, string(b)).Int(); err != nil {
			return start, nil, fmt.Errorf("write %s: %w", s.keys.Reread, err)
		} else if n == 0 {
			return start, nil, errRereadRequested // another request came meanwhile: start again with both
		}
	}
	if len(again) == 0 {
		return start, nil, nil
	}
	start.Tables = slices.DeleteFunc(slices.Clone(start.Tables), func(t string) bool { return slices.Contains(again, t) })
	s.log.Infof("re-reading %s as requested by %s at %s (pgrelay snapshot): its rows go to the queue again as r events while the stream goes on",
		strings.Join(again, ", "), m.By, m.RequestedAt)
	return start, again, nil
}

// RequestReread writes the source's reread key for tables (each as tables[].table names it, or a
// name in schema public). The replica owning the source acts on it within a heartbeat (or at its
// next start). Tables of a request not yet applied are kept.
func RequestReread(ctx context.Context, cfg Config, tables []string, w io.Writer) error {
	var want []string
	for _, t := range tables {
		schema, name := ParseTable(t)
		full := Table{Schema: schema, Name: name}.Full()
		if !slices.ContainsFunc(cfg.Tables, func(c Table) bool { return c.Names(full) }) {
			return errcode.New(errcode.TableMissing, fmt.Sprintf("source %s does not stream %s", cfg.Name, full),
				"name a table of its tables list: "+strings.Join(tableList(cfg.Tables), ", "))
		}
		if !slices.Contains(want, full) {
			want = append(want, full)
		}
	}
	if len(want) == 0 {
		return errcode.New(errcode.TableMissing, "no table named", "name one or more tables of source "+cfg.Name+": "+strings.Join(tableList(cfg.Tables), ", "))
	}
	rdb, keys, err := adminRedis(ctx, &cfg, redisconn.UseReread)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if n, err := rdb.Exists(ctx, keys.Pointer).Result(); err != nil {
		return fmt.Errorf("redis: %w", err)
	} else if n == 0 {
		return errcode.New(errcode.TableMissing, fmt.Sprintf("source %s has not started yet (no pointer): there is nothing to read again", cfg.Name),
			"start it: its first start reads every table (snapshot: initial)")
	}
	var old rereadMark
	if raw, err := rdb.Get(ctx, keys.Reread).Bytes(); err == nil && json.Unmarshal(raw, &old) == nil && old.AppliedPos == "" {
		for _, t := range old.Tables {
			if !slices.Contains(want, t) {
				want = append(want, t)
			}
		}
	}
	req, _ := json.Marshal(rereadMark{Tables: want, RequestedAt: time.Now().UTC().Format(time.RFC3339Nano), By: requester()})
	if err := rdb.Set(ctx, keys.Reread, req, 0).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "re-read of %s requested from source %s (%s): the owning pgrelay reads them again while it streams, their rows going to the queue as r events\n",
		strings.Join(want, ", "), cfg.Name, keys.Reread)
	return nil
}
