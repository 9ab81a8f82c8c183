package source

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/retry"
)

// errResyncRequested ends a streaming session when the resync key appears.
var errResyncRequested = errcode.New(errcode.Resync, "a resync was requested (`pgrelay resync`)",
	"none: pg_cdc drops and recreates the slot, starts a new epoch and snapshots every table")

// resyncRequested reports whether the resync key exists.
func (s *Source) resyncRequested(ctx context.Context) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.keys.Resync).Result()
	if err != nil {
		return false, fmt.Errorf("read %s: %w", s.keys.Resync, err)
	}
	return n > 0, nil
}

// sleepUnlessResync sleeps d, waking early when a resync is requested (so an owner stopped on
// slot_lost acts on `pgrelay resync` at once instead of after its backoff).
func (s *Source) sleepUnlessResync(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	for ctx.Err() == nil && time.Now().Before(end) {
		retry.Sleep(ctx, min(time.Until(end), 500*time.Millisecond))
		if ok, _ := s.resyncRequested(ctx); ok {
			return
		}
	}
}

// resync drops and recreates the slot and replaces the pointer, in one fenced write, with the
// first pointer of a new epoch (generation +1) whose snapshot covers every table.
func (s *Source) resync(ctx context.Context, pool *pgxpool.Pool, sys pglogrepl.IdentifySystemResult) (pointer.Pointer, error) {
	gen := uint32(1)
	raw, err := s.rdb.Get(ctx, s.keys.Pointer).Result()
	if err == nil {
		g, ok := pointerGen(raw)
		if !ok {
			return pointer.Pointer{}, errcode.New(errcode.PointerCorrupt, "the stored pointer's pos is unreadable, so resync cannot place a new epoch above it",
				"stop pgrelay, run `pgrelay teardown`, and start again")
		}
		gen = g + 1
	}
	st, err := ReadSlot(ctx, pool, s.cfg.Slot)
	if err != nil {
		return pointer.Pointer{}, err
	}
	if st.Exists {
		if err := dropSlot(ctx, pool, s.cfg.Slot, st.ActivePID); err != nil {
			return pointer.Pointer{}, err
		}
	}
	lsn, err := CreateSlot(ctx, pool, s.cfg.Slot, s.cfg.SlotFailover)
	if err != nil {
		return pointer.Pointer{}, err
	}
	p := pointer.New(gen, pointer.NewEpoch(), sys.SystemID, s.cfg.Slot, lsn-1)
	p.Snapshot, p.Tables = s.fullCursor(), s.tableNames()
	b := &Batch{Cover: p, CoverJSON: p.Marshal(time.Now()), LeaseKey: s.keys.Lease, Fence: s.lease.Token(), PointerKey: s.keys.Pointer}
	if _, err := s.writer.Write(ctx, nil, b.cover()); err != nil {
		return pointer.Pointer{}, fmt.Errorf("write the resync pointer: %w", err)
	}
	if err := s.rdb.Del(ctx, s.keys.Resync).Err(); err != nil {
		return pointer.Pointer{}, fmt.Errorf("delete %s: %w", s.keys.Resync, err)
	}
	s.log.Infof("resync: recreated slot %s at %s, epoch %s (generation %d), snapshot of %d table(s)",
		s.cfg.Slot, lsn, p.Epoch, gen, len(p.Tables))
	stored, err := s.readPointer(ctx)
	if err != nil || stored == nil {
		return pointer.Pointer{}, fmt.Errorf("read the resync pointer back: %v", err)
	}
	return *stored, nil
}

// pointerGen reads the generation from a stored pointer's pos, even when the rest is damaged.
func pointerGen(raw string) (uint32, bool) {
	var p struct {
		Pos string `json:"pos"`
	}
	if json.Unmarshal([]byte(raw), &p) != nil {
		return 0, false
	}
	g, _, ok := strings.Cut(p.Pos, "/")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(g, 16, 32)
	return uint32(v), err == nil
}

// dropSlot drops a slot, first ending the walsender holding it (an earlier session of ours: we
// hold the lease).
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string, pid int) error {
	for i := 0; pid != 0; i++ {
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return fmt.Errorf("stop the walsender of slot %s: %w", slot, err)
		}
		retry.Sleep(ctx, 200*time.Millisecond)
		st, err := ReadSlot(ctx, pool, slot)
		if err != nil {
			return err
		}
		if pid = st.ActivePID; i > 50 {
			return fmt.Errorf("slot %s is still in use by process %d", slot, pid)
		}
	}
	if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		return fmt.Errorf("drop slot %s: %w", slot, err)
	}
	return nil
}
