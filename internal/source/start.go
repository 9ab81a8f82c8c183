package source

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/retry"
)

// session connects, runs the start checks, and streams until an error; nil only when ctx ends.
func (s *Source) session(ctx context.Context) error {
	s.setPhase(PhaseConnecting, nil)
	if err := s.waitAcked(ctx); err != nil {
		return nil
	}
	if err := queue.CheckEviction(ctx, s.rdb); err != nil {
		return err
	}
	qcfg, err := s.cfg.PG.ConnConfig()
	if err != nil {
		return err
	}
	pcfg, _ := pgxpool.ParseConfig("")
	pcfg.ConnConfig.Config = *qcfg
	pcfg.ConnConfig.BuildFrontend = queryFrontend
	pcfg.MaxConns = 5 // readback, heartbeat, the snapshot's read and its watermarks
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	version, err := CheckServer(ctx, pool, s.cfg.SlotFailover) // the pool connects here
	if err != nil {
		return pgconnect.Explain(err) // a TLS, pg_hba.conf, LOGIN or CONNECT refusal gets its code and fix
	}
	if err := CheckFunctions(ctx, pool); err != nil {
		return err
	}
	expanded, err := ExpandTables(ctx, pool, s.cfg.Tables)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.matched = tableList(expanded)
	s.mu.Unlock()
	tables, refused, err := LoadTables(ctx, pool, expanded, version)
	if err != nil {
		return err
	}
	tables, refused, unpublished, err := RefuseUnpublished(ctx, pool, &s.cfg, tables, refused, version)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.unpublished = unpublished
	s.mu.Unlock()
	for _, t := range tables {
		warnings, err := PartitionsWithoutIdentity(ctx, pool, t)
		if err != nil {
			return err
		}
		for _, w := range warnings {
			s.log.Warnf("%v", w)
		}
	}
	if err := s.settleRefusals(tables, refused); err != nil {
		return err
	}
	marked, err := s.markRejoin(ctx, pool, tables, version)
	if err != nil {
		return err
	}
	pubs, err := EnsurePublications(ctx, pool, &s.cfg, tables, refused, version)
	if err != nil {
		return err
	}
	for _, b := range pubs.Broader {
		s.log.Infof("publication %s, beyond the configured tables: PostgreSQL decodes and sends the other tables' changes, and pg_cdc drops them (a publication FOR TABLE of the configured tables spares that)", b)
	}
	if err := s.ensurePublishFunction(ctx, pool); err != nil {
		return err
	}
	rcfg, err := s.cfg.PG.ReplicationConfig()
	if err != nil {
		return err
	}
	var reads *readCoalescer
	rcfg.BuildFrontend = replicationFrontend(func(c *readCoalescer) { reads = c })
	rcfg.DialFunc = dialOutsidePoller(rcfg.DialFunc)
	repl, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return pgconnect.Explain(fmt.Errorf("open the replication connection: %w", err))
	}
	defer repl.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	start, written, err := s.startPointer(ctx, pool, sys)
	if err != nil {
		return err
	}
	if err := s.alignFailover(ctx, pool, repl, version); err != nil {
		return err
	}
	start, rejoined, err := s.rejoin(ctx, start, written, marked) // PlanTables reads them again
	if err != nil {
		return err
	}
	start, reread, err := s.reread(ctx, start, written) // likewise
	if err != nil {
		return err
	}
	var added []string
	if len(reread) > 0 && !s.cfg.SnapshotInitial {
		// snapshot: never reads no added table, but a requested one: the others count as known
		for _, t := range s.tableNames() {
			if !slices.Contains(start.Tables, t) && !slices.Contains(reread, t) {
				added, start.Tables = append(added, t), append(start.Tables, t)
			}
		}
		start, _, err = PlanTables(start, s.tableNames(), true)
	} else {
		start, added, err = PlanTables(start, s.tableNames(), s.cfg.SnapshotInitial)
	}
	if err != nil {
		return err
	}
	added = slices.DeleteFunc(added, func(t string) bool { return slices.Contains(rejoined, t) || slices.Contains(reread, t) })
	if len(added) > 0 {
		what := "streamed from now on (snapshot: never)"
		if s.cfg.SnapshotInitial {
			what = "snapshotted while streaming"
		}
		s.log.Infof("table(s) %s added since the last start: %s", strings.Join(added, ", "), what)
	}
	return s.stream(ctx, pool, repl, reads, tables, pubs, start, version)
}

// checkACL checks, on each of the source's queues, that its Redis user may run the commands of the
// lease, the pointer and status keys and the queue writes (redis_acl naming the rules otherwise):
// before the first lease attempt, so a standby replica reports a missing permission too.
func (s *Source) checkACL(ctx context.Context) error { return checkACL(ctx, s.cfg, s.rdb) }

// checkACL is Source.checkACL for cfg's queues over rdb.
func checkACL(ctx context.Context, cfg Config, rdb redis.UniversalClient) error {
	done := map[string]bool{}
	for _, t := range cfg.Tables {
		if done[t.Queue] {
			continue
		}
		done[t.Queue] = true
		if err := cfg.Redis.CheckACL(ctx, rdb, t.Queue, redisconn.UseServer, redisconn.UseLease, redisconn.UseSource, redisconn.UseWrite); err != nil {
			return err
		}
	}
	return nil
}

// settleRefusals applies on_refused_table to the tables the start checks refused: stop returns
// the first refusal; skip streams the others, logging each refused table with its coded error
// (also in the status hash and the refused-table metric). With every table refused there is
// nothing to stream: the first refusal is returned. The tables streamed become the session's
// (the pointer's table list and snapshot).
func (s *Source) settleRefusals(ok []TableInfo, refused []Refusal) error {
	names := make([]string, len(ok))
	for i, t := range ok {
		names[i] = t.Full()
	}
	s.mu.Lock()
	before := s.refused
	s.streamed = names
	s.refused = refused
	s.mu.Unlock()
	if h := s.hooks.Refused; h != nil {
		now := map[string]bool{}
		for _, r := range refused {
			now[r.Table] = true
			h(r.Table, string(errcode.Of(r.Err)), true)
		}
		for _, r := range before {
			if !now[r.Table] {
				h(r.Table, string(errcode.Of(r.Err)), false)
			}
		}
	}
	if len(refused) == 0 {
		return nil
	}
	if s.cfg.StopOnRefusedTable {
		return refused[0].Err
	}
	for _, r := range refused {
		if s.hooks.Error != nil {
			s.hooks.Error(string(errcode.Of(r.Err)))
		}
		s.log.Warnf("%s is not streamed, the other tables are (on_refused_table: skip): %v", r.Table, r.Err)
	}
	if len(ok) == 0 {
		return fmt.Errorf("every configured table was refused, the first: %w", refused[0].Err)
	}
	return nil
}

// ensurePublishFunction installs pgrelay.publish() when configured to; a missing privilege is a
// warning, not a reason to stop streaming the tables.
func (s *Source) ensurePublishFunction(ctx context.Context, pool *pgxpool.Pool) error {
	if !s.cfg.PublishFunction {
		return nil
	}
	installed, err := EnsurePublishFunction(ctx, pool)
	switch {
	case errcode.Is(err, errcode.PublishFunction):
		s.log.Warnf("%v", err)
	case err != nil:
		return err
	case installed:
		s.log.Infof("installed %s", PublishFunction)
	}
	return nil
}

// startPointer settles the pointer and the slot (DESIGN §5), creating both on the first start,
// and waits while another process uses the slot. written says the pointer was written by this
// call (a first start, or a resync): after the publications were settled, so it missed nothing.
func (s *Source) startPointer(ctx context.Context, pool *pgxpool.Pool, sys pglogrepl.IdentifySystemResult) (p pointer.Pointer, written bool, err error) {
	for {
		if resync, err := s.resyncRequested(ctx); err != nil {
			return pointer.Pointer{}, false, err
		} else if resync {
			if _, err := s.resync(ctx, pool, sys); err != nil {
				return pointer.Pointer{}, false, err
			}
			written = true
		}
		ptr, err := s.readPointer(ctx)
		if err != nil {
			return pointer.Pointer{}, false, err
		}
		st, err := ReadSlot(ctx, pool, s.cfg.Slot)
		if err != nil {
			return pointer.Pointer{}, false, err
		}
		if ptr != nil {
			if err := CheckPointer(*ptr, s.cfg.Slot, sys.SystemID, st); err != nil {
				return pointer.Pointer{}, false, err
			}
		} else {
			first, err := s.firstPointer(ctx, pool, sys, st)
			if err != nil {
				return pointer.Pointer{}, false, err
			}
			ptr, written = &first, true
			if st, err = ReadSlot(ctx, pool, s.cfg.Slot); err != nil {
				return pointer.Pointer{}, false, err
			}
		}
		if err := CheckSlot(st, s.cfg.Slot, sys.DBName, *ptr); err != nil {
			return pointer.Pointer{}, false, err
		}
		if st.ActivePID == 0 {
			return *ptr, written, nil
		}
		s.setPhase(PhaseWaitingForSlot, fmt.Errorf("slot %s is in use by process %d", s.cfg.Slot, st.ActivePID))
		retry.Sleep(ctx, 2*time.Second)
		if ctx.Err() != nil {
			return pointer.Pointer{}, false, ctx.Err()
		}
	}
}

// alignFailover makes the slot's failover flag (PostgreSQL 17+) what slot.failover says: a slot
// created before the setting changed keeps its flag, and a source that believed its slot survives a
// failover while it does not would only learn it at the failover (slot_lost). When the flag cannot be
// changed, a slot_failover warning says so and the source streams on.
func (s *Source) alignFailover(ctx context.Context, pool *pgxpool.Pool, repl *pgconn.PgConn, version int) error {
	if version < 170000 {
		return nil
	}
	st, err := ReadSlot(ctx, pool, s.cfg.Slot)
	if err != nil || !st.Exists || st.Failover == s.cfg.SlotFailover {
		return err
	}
	if err := AlterSlotFailover(ctx, repl, s.cfg.Slot, s.cfg.SlotFailover); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		werr := errcode.Wrap(errcode.SlotFailover, err, fmt.Sprintf("slot %s has failover %t, slot.failover says %t, and it could not be changed", s.cfg.Slot, st.Failover, s.cfg.SlotFailover),
			fmt.Sprintf("run ALTER_REPLICATION_SLOT %s (FAILOVER %t) on a replication connection while pg_cdc is stopped, or `pgrelay resync -c <config>` (a new slot made as configured)",
				pgx.Identifier{s.cfg.Slot}.Sanitize(), s.cfg.SlotFailover))
		s.log.Warnf("%v", werr)
		if s.hooks.Error != nil {
			s.hooks.Error(string(errcode.SlotFailover))
		}
		return nil
	}
	s.log.Infof("slot %s is now a failover slot: %t (slot.failover)", s.cfg.Slot, s.cfg.SlotFailover)
	return nil
}

// firstPointer creates the slot (or adopts an existing one) and writes the first pointer of a
// new epoch; with `snapshot: initial` the pointer carries the snapshot's starting cursor.
func (s *Source) firstPointer(ctx context.Context, pool *pgxpool.Pool, sys pglogrepl.IdentifySystemResult, st SlotState) (pointer.Pointer, error) {
	at := st.ConfirmedFlush
	if !st.Exists {
		lsn, err := CreateSlot(ctx, pool, s.cfg.Slot, s.cfg.SlotFailover)
		if err != nil {
			return pointer.Pointer{}, err
		}
		at = lsn
		s.log.Infof("created slot %s at %s", s.cfg.Slot, lsn)
	}
	// The slot sends commits at or after `at`; the pointer covers the ones before it.
	p := pointer.New(1, pointer.NewEpoch(), sys.SystemID, s.cfg.Slot, at-1)
	p.Snapshot, p.Tables = s.startCursor(), s.tableNames()
	b := &Batch{Cover: p, CoverJSON: p.Marshal(time.Now()), LeaseKey: s.keys.Lease, Fence: s.lease.Token(), PointerKey: s.keys.Pointer}
	if _, err := s.writer.Write(ctx, nil, b.cover()); err != nil {
		return pointer.Pointer{}, fmt.Errorf("write the first pointer: %w", err)
	}
	stored, err := s.readPointer(ctx)
	if err != nil || stored == nil {
		return pointer.Pointer{}, fmt.Errorf("read the first pointer back: %v", err)
	}
	return *stored, nil
}

// readPointer reads the stored pointer (nil when there is none).
func (s *Source) readPointer(ctx context.Context) (*pointer.Pointer, error) {
	return ReadPointer(ctx, s.rdb, s.keys.Pointer)
}

// ReadPointer reads a stored pointer (nil when there is none).
func ReadPointer(ctx context.Context, rdb redis.Cmdable, key string) (*pointer.Pointer, error) {
	raw, err := rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pointer %s: %w", key, err)
	}
	p, err := pointer.Parse(raw)
	if err != nil {
		return nil, err
	}
	return &p, nil
}
