package source

import (
	"context"
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
	if err := drift(ctx); errcode.Of(err) != "" {
		return err
	}
	return nil
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
