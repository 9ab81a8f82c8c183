package source

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// heartbeat emits a non-transactional logical message when no WAL data arrived for a while, so
// an idle publication still advances the pointer and the slot. On each tick it also reports the
// slot's lag, ends the session for a requested resync, and checks the publications (drift: a
// publication error ends the session).
func (ss *session) heartbeat(pool *pgxpool.Pool, epoch string, drift func(context.Context) error) {
	every := ss.src.cfg.Heartbeat
	t := time.NewTicker(every / 2)
	defer t.Stop()
	seen, lastData := ss.dataMsgs.Load(), time.Now() // WAL data counted, and when the count last moved
	for {
		select {
		case <-ss.ctx.Done():
			return
		case <-t.C:
		}
		ss.reportSlotLag(pool)
		if resync, err := ss.src.resyncRequested(ss.ctx); err == nil && resync {
			ss.fail(errResyncRequested)
			return
		}
		if ss.src.rereadPending(ss.ctx) {
			ss.fail(errRereadRequested)
			return
		}
		if err := ss.checkDrift(drift, every); err != nil {
			ss.fail(err)
			return
		}
		if n := ss.dataMsgs.Load(); n != seen {
			seen, lastData = n, time.Now()
		}
		if time.Since(lastData) < every {
			continue
		}
		ctx, cancel := context.WithTimeout(ss.ctx, every)
		_, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'pgrelay_heartbeat', $1::text)`, epoch)
		cancel()
		if err != nil && ss.ctx.Err() == nil {
			ss.src.log.Warnf("heartbeat: %v", err)
		}
		lastData = time.Now()
	}
}

// checkDrift runs the publication check: its coded error, or nil (a failure to query is left to
// the stream and the next tick: the server is busy or going).
func (ss *session) checkDrift(drift func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ss.ctx, timeout)
	defer cancel()
	if err := drift(ctx); errcode.Of(err) != "" || errors.Is(err, errNewTables) {
		return err
	}
	return nil
}

// errNewTables ends a streaming session when a table was created that a tables[] pattern names, or
// when one an unmanaged publication lacked joined it: the next start publishes (or takes) it and,
// with snapshot: initial, reads it. It is no failure.
var errNewTables = errors.New("new tables match the tables patterns")

// newMatches reports, as errNewTables, the tables the patterns name now that the session's start did
// not find, and those it refused for an unmanaged publication that now holds them (a failure to
// read them is left to the next tick).
func (s *Source) newMatches(ctx context.Context, q queryer, version int) error {
	if !slices.ContainsFunc(s.cfg.Tables, Table.Pattern) {
		return nil
	}
	now, err := ExpandTables(ctx, q, s.cfg.Tables)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	matched, unpublished := s.matched, s.unpublished
	s.mu.Unlock()
	var added []string
	for _, t := range now {
		if !slices.Contains(matched, t.Full()) {
			added = append(added, fmt.Sprintf("%s (matched by %s)", t.Full(), t.From))
		}
	}
	if len(unpublished) > 0 {
		out, err := outOfPublications(ctx, q, []string{s.cfg.Publication, s.cfg.InsertPublication}, unpublished, version)
		if err != nil {
			return nil
		}
		for _, t := range unpublished {
			if !slices.Contains(out, t.Full()) {
				added = append(added, t.Full()+" (now in the publication)")
			}
		}
	}
	if len(added) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; starting the session again to stream them", errNewTables, strings.Join(added, ", "))
}

// reportSlotLag publishes the slot's lag (current WAL − confirmed_flush_lsn) in bytes.
func (ss *session) reportSlotLag(pool *pgxpool.Pool) {
	if ss.src.hooks.SlotLag == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ss.ctx, 5*time.Second)
	defer cancel()
	var lag int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::bigint
		FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, ss.src.cfg.Slot).Scan(&lag); err == nil {
		ss.src.hooks.SlotLag(lag)
	}
}
