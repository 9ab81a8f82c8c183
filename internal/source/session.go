package source

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// session is one streaming life: from the pointer to an error, a fence or Close.
type session struct {
	src    *Source
	ctx    context.Context
	cancel context.CancelCauseFunc
	q      *itemQueue
	fence  string
	flush  atomic.Uint64 // the acknowledged pointer's lsn, reported to PostgreSQL
	every  time.Duration // how often to report the position with nothing new

	// bundler state (used by Next/Ack, one batch at a time)
	plan          pointer.Pointer // the cover of everything handed out so far
	scan          scan            // how far build measured the queued items (bundler only)
	firstSeen     time.Time
	lastIdleWrite time.Time
	// the arrival rate (evAvg events per gapAvg seconds, averaged over the last batches) and the
	// last batch's build time, for load_linger (bundler only)
	evAvg, gapAvg float64
	lastCut       time.Time
	lastAck       atomic.Int64 // unix ns of the last ack of a batch with events (set by acked)
	readPause     atomic.Int64 // unix ns: the reader may leave the WAL unread until then (a wait to fill): its next turn
	// the reader's turns under load (coalesce.go, readTurn)
	readWake   chan struct{} // capacity 1: the bundler gave a turn, or wants data
	wantData   atomic.Bool   // the bundler has nothing to send and waits for data
	readServed atomic.Int64  // the turn (readPause) whose read is queued
	readDone   chan struct{} // capacity 1: a turn was served
	readTick   *time.Ticker  // every turnWaitMax: bounds a wait for the next turn

	lag      lagMeter       // how late transactions arrive after their commit (reader only)
	dataMsgs atomic.Uint64  // WAL data messages received, for the heartbeat (counted: a clock read per message costs)
	coalesce *readCoalescer // the replication connection's reader: told at each commit whether the stream is behind

	snap *snapshotter // nil when the pointer has no snapshot in progress
}

// fail ends the session with err.
func (ss *session) fail(err error) { ss.cancel(err) }

// stream starts replication at the pointer and runs the reader and heartbeat until one fails.
// reads is the replication connection's reader (nil: reads go straight to the connection).
func (s *Source) stream(ctx context.Context, pool *pgxpool.Pool, repl *pgconn.PgConn, reads *readCoalescer, tables []TableInfo, pubs Publications, start pointer.Pointer, version int) error {
	names := pubs.Names()
	for i, n := range names { // a list of quoted identifiers inside a string literal
		names[i] = `"` + strings.ReplaceAll(strings.ReplaceAll(n, `"`, `""`), "'", "''") + `"`
	}
	err := pglogrepl.StartReplication(ctx, repl, s.cfg.Slot, start.LSNValue(), pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + strings.Join(names, ",") + "'", "messages 'true'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			s.setPhase(PhaseWaitingForSlot, err)
		}
		return fmt.Errorf("START_REPLICATION: %w", err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ss := &session{src: s, ctx: sctx, cancel: cancel, q: newItemQueue(s.cfg.MaxBundleMessages, s.cfg.MaxBundleBytes),
		fence: s.lease.Token(), plan: start, coalesce: reads, readWake: make(chan struct{}, 1), readDone: make(chan struct{}, 1), readTick: time.NewTicker(turnWaitMax)}
	defer ss.readTick.Stop()
	if reads != nil {
		reads.turn = ss.readTurn
	}
	ss.flush.Store(uint64(start.LSNValue()))
	ss.every = statusInterval(ctx, pool)
	byName, byOID := map[string]*TableInfo{}, map[uint32]*TableInfo{}
	for i := range tables {
		byName[tables[i].Full()] = &tables[i]
		if tables[i].OID != 0 {
			byOID[tables[i].OID] = &tables[i]
		}
	}
	reg := convert.NewRegistry()
	dec := &decoder{epoch: start.Epoch, start: start, truncEm: s.cfg.TruncateEmit, tables: byName, byOID: byOID, reg: reg,
		renamed: func(ctx context.Context, t *TableInfo, inStream string) { s.logRenamed(ctx, pool, t, inStream) },
		rels:    map[uint32]*relation{}, envs: newEnvelopes(&s.cfg), maxMessages: s.cfg.MaxBundleMessages, maxBytes: s.cfg.MaxBundleBytes,
		loadType: func(ctx context.Context, oids []uint32) error { return reg.Load(ctx, pool, oids) },
		readback: func(ctx context.Context, rel *relation, key event.Row, cols []int, xid uint32) (event.Row, error) {
			return readback(ctx, pool, rel, key, cols, xid)
		},
	}
	sn, cur, err := ss.newSnapshotter(pool, tables, version)
	if err != nil {
		return err
	}
	ss.snap = sn
	s.setSession(ss)
	defer s.setSession(nil)
	if sn != nil {
		s.setPhase(PhaseSnapshot, nil)
	} else {
		s.setPhase(PhaseStreaming, nil)
	}
	s.log.Infof("streaming from %s (epoch %s)", start.Position(), start.Epoch)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ss.heartbeat(pool, start.Epoch, func(ctx context.Context) error {
			if err := PublicationDrift(ctx, pool, pubs, tables, version); err != nil {
				return err
			}
			return s.newMatches(ctx, pool, version)
		})
	}()
	if sn != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sn.run(*cur); err != nil && sctx.Err() == nil {
				ss.fail(fmt.Errorf("snapshot: %w", err))
			}
		}()
	}
	err = ss.read(repl, dec)
	cancel(err)
	wg.Wait()
	if ctx.Err() != nil { // Close: the last status was sent by read
		return nil
	}
	if cause := context.Cause(sctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// logRenamed tells of a configured table met in the stream under another name (the decoder keeps
// streaming it under its configured one): renamed since pg_cdc started (a warning, naming what the
// next start does), or named otherwise when changes streamed now were made (info).
func (s *Source) logRenamed(ctx context.Context, pool *pgxpool.Pool, t *TableInfo, inStream string) {
	if now, err := tableName(ctx, pool, t.OID); err == nil && now == t.Full() {
		s.log.Infof("table %s was named %s when changes now streamed were made; they go to queue %s as %s", t.Full(), inStream, t.Queue, t.Full())
		return
	} else if err == nil && now != "" {
		inStream = now
	}
	next := fmt.Sprintf("Set tables[].table to %s before pg_cdc restarts: the start looks tables up by name (nothing is lost meanwhile)", inStream)
	if t.From != "" {
		schema, pattern := ParseTable(t.From)
		next = fmt.Sprintf("%s does not match it: the next start no longer streams it", t.From)
		if (Table{Schema: schema, Name: pattern}).Names(inStream) {
			next = fmt.Sprintf("%s matches it: the next start streams it as %s", t.From, inStream)
		}
	}
	s.log.Warnf("table %s (oid %d) was renamed to %s: its changes keep going to queue %s as %s. %s", t.Full(), t.OID, inStream, t.Queue, t.Full(), next)

}
