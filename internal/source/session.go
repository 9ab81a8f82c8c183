package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
)

// statusEvery is how often the reader reports its position when nothing changed (at most; a
// quarter of the server's wal_sender_timeout when that is shorter); a new flush position is
// reported within flushReportDelay.
const (
	statusEvery      = 10 * time.Second
	flushReportDelay = time.Second
	idleWriteEvery   = time.Second
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
	firstSeen     time.Time
	lastIdleWrite time.Time

	lastData atomic.Int64 // unix nanos of the last WAL data, for the heartbeat

	snap *snapshotter // nil when the pointer has no snapshot in progress
}

// fail ends the session with err.
func (ss *session) fail(err error) { ss.cancel(err) }

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
	pcfg.MaxConns = 5 // readback, heartbeat, the snapshot's read and its watermarks
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	version, err := CheckServer(ctx, pool, s.cfg.SlotFailover) // the pool connects here
	if err != nil {
		return pgconnect.Explain(err) // a TLS or pg_hba.conf refusal gets its code and fix
	}
	tables, err := LoadTables(ctx, pool, s.cfg.Tables)
	if err != nil {
		return err
	}
	if err := EnsurePublication(ctx, pool, s.cfg.Publication, s.cfg.ManagePublication, tables, version); err != nil {
		return err
	}
	if err := s.ensurePublishFunction(ctx, pool); err != nil {
		return err
	}
	rcfg, err := s.cfg.PG.ReplicationConfig()
	if err != nil {
		return err
	}
	repl, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return pgconnect.Explain(fmt.Errorf("open the replication connection: %w", err))
	}
	defer repl.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	start, err := s.startPointer(ctx, pool, sys)
	if err != nil {
		return err
	}
	start, added, err := PlanTables(start, s.tableNames(), s.cfg.SnapshotInitial)
	if err != nil {
		return err
	}
	if len(added) > 0 {
		what := "streamed from now on (snapshot: never)"
		if s.cfg.SnapshotInitial {
			what = "snapshotted while streaming"
		}
		s.log.Infof("pg_cdc %s: table(s) %s added since the last start: %s", s.cfg.Name, strings.Join(added, ", "), what)
	}
	return s.stream(ctx, pool, repl, tables, start, version)
}

// ensurePublishFunction installs pgrelay.publish() when configured to; a missing privilege is a
// warning, not a reason to stop streaming the tables.
func (s *Source) ensurePublishFunction(ctx context.Context, pool *pgxpool.Pool) error {
	if !s.cfg.PublishFunction {
		return nil
	}
	installed, err := EnsurePublishFunction(ctx, pool)
	switch {
	case errcode.Is(err, "publish_function"):
		s.log.Warnf("pg_cdc %s: %v", s.cfg.Name, err)
	case err != nil:
		return err
	case installed:
		s.log.Infof("pg_cdc %s: installed %s", s.cfg.Name, PublishFunction)
	}
	return nil
}

// startPointer settles the pointer and the slot (DESIGN §5), creating both on the first start,
// and waits while another process uses the slot.
func (s *Source) startPointer(ctx context.Context, pool *pgxpool.Pool, sys pglogrepl.IdentifySystemResult) (pointer.Pointer, error) {
	for {
		if resync, err := s.resyncRequested(ctx); err != nil {
			return pointer.Pointer{}, err
		} else if resync {
			if _, err := s.resync(ctx, pool, sys); err != nil {
				return pointer.Pointer{}, err
			}
		}
		ptr, err := s.readPointer(ctx)
		if err != nil {
			return pointer.Pointer{}, err
		}
		st, err := ReadSlot(ctx, pool, s.cfg.Slot)
		if err != nil {
			return pointer.Pointer{}, err
		}
		if ptr != nil {
			if err := CheckPointer(*ptr, s.cfg.Slot, sys.SystemID, st); err != nil {
				return pointer.Pointer{}, err
			}
		} else {
			p, err := s.firstPointer(ctx, pool, sys, st)
			if err != nil {
				return pointer.Pointer{}, err
			}
			ptr = &p
			if st, err = ReadSlot(ctx, pool, s.cfg.Slot); err != nil {
				return pointer.Pointer{}, err
			}
		}
		if err := CheckSlot(st, s.cfg.Slot, sys.DBName, *ptr); err != nil {
			return pointer.Pointer{}, err
		}
		if st.ActivePID == 0 {
			return *ptr, nil
		}
		s.setPhase(PhaseWaitingForSlot, fmt.Errorf("slot %s is in use by process %d", s.cfg.Slot, st.ActivePID))
		sleep(ctx, 2*time.Second)
		if ctx.Err() != nil {
			return pointer.Pointer{}, ctx.Err()
		}
	}
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
		s.log.Infof("pg_cdc %s: created slot %s at %s", s.cfg.Name, s.cfg.Slot, lsn)
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

// stream starts replication at the pointer and runs the reader and heartbeat until one fails.
func (s *Source) stream(ctx context.Context, pool *pgxpool.Pool, repl *pgconn.PgConn, tables []TableInfo, start pointer.Pointer, version int) error {
	pub := strings.ReplaceAll(s.cfg.Publication, `"`, `""`)
	err := pglogrepl.StartReplication(ctx, repl, s.cfg.Slot, start.LSNValue(), pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf(`publication_names '"%s"'`, strings.ReplaceAll(pub, "'", "''")), "messages 'true'"},
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
		fence: s.lease.Token(), plan: start}
	ss.flush.Store(uint64(start.LSNValue()))
	ss.every = statusInterval(ctx, pool)
	ss.lastData.Store(time.Now().UnixNano())
	byName := map[string]*TableInfo{}
	for i := range tables {
		byName[tables[i].Full()] = &tables[i]
	}
	reg := convert.NewRegistry()
	dec := &decoder{epoch: start.Epoch, start: start, truncEm: s.cfg.TruncateEmit, tables: byName, reg: reg,
		rels:     map[uint32]*relation{},
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
	s.log.Infof("pg_cdc %s: streaming from %s (epoch %s)", s.cfg.Name, start.Position(), start.Epoch)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ss.heartbeat(pool, start.Epoch)
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

// statusInterval is statusEvery, or a quarter of wal_sender_timeout when that is shorter, so the
// walsender never times out even while the reader is held back by a slow output.
func statusInterval(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	var ms int64
	if err := pool.QueryRow(ctx, `SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&ms); err != nil || ms <= 0 {
		return statusEvery
	}
	return max(min(statusEvery, time.Duration(ms)*time.Millisecond/4), 100*time.Millisecond)
}

// read receives the WAL, answers keepalives and reports the flush position; it returns when the
// session ends (after sending the final position).
func (ss *session) read(repl *pgconn.PgConn, dec *decoder) error {
	var sentFlush uint64
	lastStatus := time.Time{}
	sendStatus := func() error {
		f := ss.flush.Load()
		lsn := pglogrepl.LSN(f)
		err := pglogrepl.SendStandbyStatusUpdate(context.Background(), repl, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ClientTime: time.Now()})
		sentFlush, lastStatus = f, time.Now()
		return err
	}
	nextStatus := func() time.Time {
		if ss.flush.Load() != sentFlush {
			return lastStatus.Add(flushReportDelay)
		}
		return lastStatus.Add(ss.every)
	}
	defer func() { _ = sendStatus() }()
	var lastPos pglogrepl.LSN
	position := func(lsn pglogrepl.LSN) error {
		if dec.inTxn || lsn <= lastPos {
			return nil
		}
		lastPos = lsn
		return ss.push(item{kind: itemPosition, lsn: lsn}, sendStatus, nextStatus)
	}
	emit := func(it item) error {
		if it.kind == itemCommit && it.commit > lastPos {
			lastPos = it.commit
		}
		if it.kind == itemChunk && it.commit-1 > lastPos {
			lastPos = it.commit - 1
		}
		if ss.snap != nil {
			ss.snap.observe(it)
		}
		return ss.push(it, sendStatus, nextStatus)
	}
	var rctx deadlineCtx // one deadline context per status period, not one (a timer) per message
	defer rctx.stop()
	for {
		if !time.Now().Before(nextStatus()) {
			if err := sendStatus(); err != nil {
				return fmt.Errorf("send standby status: %w", err)
			}
		}
		raw, err := repl.ReceiveMessage(rctx.until(ss.ctx, nextStatus()))
		if err != nil {
			if ss.ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive WAL: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if err := ss.copyData(m.Data, dec, emit, position, &lastStatus); err != nil {
				if ss.ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
}

func (ss *session) copyData(data []byte, dec *decoder, emit func(item) error, position func(pglogrepl.LSN) error, lastStatus *time.Time) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if ka.ReplyRequested {
			*lastStatus = time.Time{}
		}
		if ka.ServerWALEnd > 0 {
			// Every record before ServerWALEnd was decoded and sent: commits ≤ end-1 are all here.
			return position(ka.ServerWALEnd - 1)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		ss.lastData.Store(time.Now().UnixNano())
		msg, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return fmt.Errorf("decode pgoutput: %w", err)
		}
		if lm, ok := msg.(*pglogrepl.LogicalDecodingMessage); ok && !lm.Transactional {
			if lm.Prefix == WatermarkPrefix && ss.snap != nil {
				if handled, err := ss.watermark(lm, emit); handled || err != nil {
					return err
				}
			}
			if lm.LSN > 0 {
				return position(lm.LSN - 1)
			}
			return nil
		}
		return dec.handle(ss.ctx, msg, emit)
	}
	return nil
}

// push hands an item to the bundler, blocking while the queue is full but still reporting the
// position to PostgreSQL on time, so a slow output never times the walsender out.
func (ss *session) push(it item, sendStatus func() error, nextStatus func() time.Time) error {
	for {
		ok, changed := ss.q.tryPush(it)
		if ok {
			return nil
		}
		t := time.NewTimer(time.Until(nextStatus()))
		select {
		case <-changed:
		case <-t.C:
			if err := sendStatus(); err != nil {
				t.Stop()
				return fmt.Errorf("send standby status: %w", err)
			}
		case <-ss.ctx.Done():
			t.Stop()
			return ss.ctx.Err()
		}
		t.Stop()
	}
}

// heartbeat emits a non-transactional logical message when no WAL data arrived for a while, so
// an idle publication still advances the pointer and the slot.
func (ss *session) heartbeat(pool *pgxpool.Pool, epoch string) {
	every := ss.src.cfg.Heartbeat
	t := time.NewTicker(every / 2)
	defer t.Stop()
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
		if time.Since(time.Unix(0, ss.lastData.Load())) < every {
			continue
		}
		ctx, cancel := context.WithTimeout(ss.ctx, every)
		_, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'pgrelay_heartbeat', $1::text)`, epoch)
		cancel()
		if err != nil && ss.ctx.Err() == nil {
			ss.src.log.Warnf("pg_cdc %s: heartbeat: %v", ss.src.cfg.Name, err)
		}
		ss.lastData.Store(time.Now().UnixNano())
	}
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

// readback reads the current values of cols of the row whose key is in row (nil when gone).
//
// PostgreSQL flushes a commit record, so the walsender can decode it, before the committing backend
// leaves the proc array (a synchronous standby can hold it there for long): until then other sessions
// do not see the transaction's rows. So a row not found is only trusted once transaction xid is no
// longer in progress; readback waits for that and reads again.
func readback(ctx context.Context, pool *pgxpool.Pool, rel *relation, row event.Row, cols []int, xid uint32) (event.Row, error) {
	t := rel.table
	var sel, where []string
	var params [][]byte
	for _, c := range cols {
		sel = append(sel, pgx.Identifier{t.Columns[c].Name}.Sanitize())
	}
	for i, k := range t.Key {
		where = append(where, fmt.Sprintf("%s = $%d", pgx.Identifier{t.Columns[k].Name}.Sanitize(), i+1))
		params = append(params, row[k].Data)
	}
	schema, name, _ := strings.Cut(t.Name, ".")
	sql := "SELECT " + strings.Join(sel, ", ") + " FROM " + pgx.Identifier{schema, name}.Sanitize() + " WHERE " + strings.Join(where, " AND ")
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read back unchanged values: %w", err)
	}
	defer conn.Release()
	res := conn.Conn().PgConn().ExecParams(ctx, sql, params, nil, nil, nil).Read()
	if res.Err == nil && len(res.Rows) == 0 {
		if err := waitVisible(ctx, conn.Conn().PgConn(), xid); err != nil {
			return nil, fmt.Errorf("read back unchanged values of %s: %w", t.Name, err)
		}
		res = conn.Conn().PgConn().ExecParams(ctx, sql, params, nil, nil, nil).Read()
	}
	if res.Err != nil {
		return nil, fmt.Errorf("read back unchanged values of %s: %w", t.Name, res.Err)
	}
	if len(res.Rows) == 0 {
		return nil, nil
	}
	return event.TextRow(nil, res.Rows[0]), nil
}

// xactStatusSQL is the status of a 32-bit xid widened to the full xid of the current epoch (or the
// one before, for an xid above the current counter), read without assigning an xid to this session.
const xactStatusSQL = `SELECT pg_xact_status((CASE WHEN w > m THEN w - 4294967296 ELSE w END)::text::xid8)
FROM (SELECT m, ((m >> 32) << 32) + $1::bigint AS w
      FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS m) s) x`

// waitVisible waits until transaction xid is no longer in progress, so its rows are visible.
func waitVisible(ctx context.Context, conn *pgconn.PgConn, xid uint32) error {
	param := [][]byte{[]byte(strconv.FormatUint(uint64(xid), 10))}
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		res := conn.ExecParams(ctx, xactStatusSQL, param, nil, nil, nil).Read()
		if res.Err != nil {
			return fmt.Errorf("status of transaction %d: %w", xid, res.Err)
		}
		if len(res.Rows) == 1 && string(res.Rows[0][0]) != "in progress" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// waitFor says what the bundler waits on when no batch is due.
type waitFor struct {
	ch    <-chan struct{}
	after time.Duration
}

// bundle builds the next batch from the queued items, or does an idle pointer advance, or says
// what to wait for. Only Next calls it, with no batch unacknowledged.
func (ss *session) bundle(ctx context.Context) (*Batch, waitFor, error) { return ss.build(ctx, false) }

// build is bundle; ahead (while the previous batch is still in flight) returns only a full
// batch and never writes the pointer, so nothing moves it under the batch in flight.
func (ss *session) build(ctx context.Context, ahead bool) (*Batch, waitFor, error) {
	cfg := &ss.src.cfg
	items, changed := ss.q.snapshot()
	idle := waitFor{ch: changed, after: time.Hour}
	if ss.ctx.Err() != nil {
		return nil, idle, nil
	}
	// The cover is built once at the end: per-change pointer values would cost an allocation each.
	complete, inTxn, txCommit, txDone := ss.plan.LSNValue(), ss.plan.InTxn != nil, ss.plan.CommitValue(), uint64(0)
	if inTxn {
		txDone = ss.plan.InTxn.Done
	}
	var events []Event
	var cursor json.RawMessage
	size, n, full, txns, chunks := 0, 0, false, 0, uint64(0)
	for ; n < len(items) && !full; n++ {
		it := items[n]
		switch it.kind {
		case itemChange:
			if len(events) > 0 && (len(events)+len(it.events) > cfg.MaxBundleMessages || size+it.size > cfg.MaxBundleBytes) {
				full = true
				n--
				continue
			}
			events = append(events, it.events...)
			size += it.size
			inTxn, txCommit, txDone = true, it.commit, it.seq+1
		case itemCommit:
			complete, inTxn = it.commit, false
			txns++
		case itemChunk:
			if len(events) > 0 && (len(events)+len(it.events) > cfg.MaxBundleMessages || size+it.size > cfg.MaxBundleBytes) {
				full = true
				n--
				continue
			}
			events = append(events, it.events...)
			size += it.size
			if it.commit-1 > complete { // every commit before the high watermark is in
				complete = it.commit - 1
			}
			cursor = it.chunk.cursor
			chunks++
		case itemPosition:
			if !inTxn && it.lsn > complete {
				complete = it.lsn
			}
		}
	}
	cover := ss.plan.AtCommit(complete)
	if inTxn {
		cover = cover.InsideTxn(txCommit, txDone)
	}
	if chunks > 0 {
		cover.Snapshot, cover.SnapshotChunks = cursor, cover.SnapshotChunks+chunks
	}
	if len(events) == 0 {
		if ahead {
			return nil, idle, nil
		}
		if n == 0 || !ss.plan.Less(cover) {
			ss.q.pop(n)
			return nil, idle, nil
		}
		if chunks > 0 { // an empty chunk moves the cursor at once
			return nil, idle, ss.idleAdvance(ctx, cover, n)
		}
		if wait := time.Until(ss.lastIdleWrite.Add(idleWriteEvery)); wait > 0 {
			return nil, waitFor{ch: changed, after: wait}, nil
		}
		return nil, idle, ss.idleAdvance(ctx, cover, n)
	}
	if !full && (len(events) < cfg.MaxBundleMessages && size < cfg.MaxBundleBytes) {
		if ahead {
			return nil, idle, nil
		}
		if cover.InTxn != nil { // the rest of the transaction is on its way
			return nil, idle, nil
		}
		if ss.firstSeen.IsZero() {
			ss.firstSeen = time.Now()
		}
		if wait := time.Until(ss.firstSeen.Add(cfg.Linger)); wait > 0 {
			return nil, waitFor{ch: changed, after: wait}, nil
		}
	}
	ss.q.pop(n)
	ss.plan = cover
	ss.firstSeen = time.Time{}
	return &Batch{Events: events, Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease,
		Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss, txns: txns}, idle, nil
}

// idleAdvance moves the pointer over items without events (idle WAL, empty transactions).
func (ss *session) idleAdvance(ctx context.Context, cover pointer.Pointer, n int) error {
	b := &Batch{Cover: cover, CoverJSON: cover.Marshal(time.Now()), LeaseKey: ss.src.keys.Lease, Fence: ss.fence, PointerKey: ss.src.keys.Pointer, sess: ss}
	ss.lastIdleWrite = time.Now()
	if _, err := ss.src.writer.Write(ctx, nil, b.cover()); err != nil {
		if errcode.Is(err, "fenced") {
			return err
		}
		ss.src.log.Warnf("pg_cdc %s: idle pointer advance: %v", ss.src.cfg.Name, err)
		return nil
	}
	ss.q.pop(n)
	ss.plan = cover
	ss.acked(b)
	return nil
}

// acked records that b's cover is durably the pointer: PostgreSQL may now drop the WAL before it.
func (ss *session) acked(b *Batch) {
	ss.flush.Store(uint64(b.Cover.LSNValue()))
	if ss.snap != nil {
		ss.snap.ackedCover(b.Cover.SnapshotChunks)
	}
	h := ss.src.hooks
	if h.PointerLSN != nil {
		h.PointerLSN(uint64(b.Cover.LSNValue()))
	}
	if h.Transactions != nil && b.txns > 0 {
		h.Transactions(int64(b.txns))
	}
	if len(b.Events) > 0 {
		if h.Messages != nil {
			h.Messages(int64(len(b.Events)))
		}
		if h.Bundles != nil {
			h.Bundles(1)
		}
	}
}
