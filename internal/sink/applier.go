package sink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
)

// Message is one queue message as the sink sees it (metadata of DESIGN §6 plus the payload).
type Message struct {
	Queue       string
	Shard       int32
	Offset      int64
	HasPosition bool // queue, shard and offset are known: the message is deduplicated by the progress table
	Partition   string
	MessageID   string
	// TransactionID is the id shared by the messages of one source transaction (may be empty).
	TransactionID string
	CreatedAt     int64 // milliseconds since the epoch; 0 = unknown
	Payload       []byte
}

func (m *Message) shardKey() ShardKey { return ShardKey{Queue: m.Queue, Shard: m.Shard} }

// Outcome is what happened to one message of a batch.
type Outcome int

// The outcomes of one message.
const (
	Applied Outcome = iota // its effects are committed with its progress row
	Skipped                // at or below its shard's last_offset: already applied earlier
	Failed                 // a data error: Errs holds "SQLSTATE: message (detail)" or bad_payload
	Blocked                // after a failed message of the same shard: not applied, no attempt counted
)

// Result reports a committed batch message by message.
type Result struct {
	Outcomes                          []Outcome
	Errs                              []error // for Failed and Blocked messages
	Applied, Skipped, Failed, Blocked int
}

// RetryHook is told about every error the applier retries, with its class and the wait before the
// next attempt; the plugin logs and counts them.
type RetryHook func(err error, class Class, wait time.Duration)

// Applier writes batches of messages into the target exactly once (DESIGN §7).
type Applier struct {
	pool     *pgxpool.Pool
	cfg      Config
	progress *Progress
	onRetry  RetryHook

	mu      sync.Mutex
	handler modeHandler
	target  *Target // the one target (nil in sql mode, and with tables: see routedMode)
	stale   bool    // re-read the target before the next attempt
	checked time.Time
	keys    map[string]*unknownKeys // by target: payload keys that name no column, across its shapes
	// skippedTables are the event tables on_unmapped_table: skip has told of
	skippedTables map[string]bool
	otherTables   *tableWatch // mode cdc with table: the event tables met (nil: not followed)
}

// shapeCheckInterval is how often a batch compares the target's catalog version with the one the
// statements were built for, so an ALTER TABLE (say, a new column) is seen within about a second.
const shapeCheckInterval = time.Second

// NewApplier checks the configuration and that the server takes writes, creates or checks the
// progress table and inspects the target.
func NewApplier(ctx context.Context, pool *pgxpool.Pool, cfg Config, onRetry RetryHook) (*Applier, error) {
	a, _, err := start(ctx, pool, cfg, cfg.CreateProgressTable)
	if err != nil {
		return nil, err
	}
	a.onRetry = onRetry
	if a.onRetry == nil {
		a.onRetry = func(error, Class, time.Duration) {}
	}
	return a, nil
}

// Check runs NewApplier's checks and changes nothing (`pgrelay check`): the configuration, the
// progress table (a missing one passes when create_progress_table lets the sink create it:
// creates is then true), and the target table and its privileges, or in sql mode the statements.
func Check(ctx context.Context, pool *pgxpool.Pool, cfg Config) (creates bool, err error) {
	_, creates, err = start(ctx, pool, cfg, false)
	return creates, err
}

// start is NewApplier's checks, the progress table created only when create is true; creates
// reports a missing progress table that the configuration lets the sink create.
func start(ctx context.Context, pool *pgxpool.Pool, cfg Config, create bool) (a *Applier, creates bool, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, false, err
	}
	prog, err := NewProgress(cfg.Name, cfg.ProgressTable)
	if err != nil {
		return nil, false, err
	}
	if err := pgconnect.CheckWritable(ctx, pool); err != nil {
		return nil, false, err
	}
	if err := prog.Ensure(ctx, pool, create); err != nil {
		if !errcode.Is(err, errcode.ProgressTableMissing) || !cfg.CreateProgressTable {
			return nil, false, err
		}
		creates = true
	}
	a = &Applier{pool: pool, cfg: cfg, progress: prog, keys: map[string]*unknownKeys{}, skippedTables: map[string]bool{}}
	if cfg.OnOtherTable != nil && cfg.Mode == ModeCDC {
		a.otherTables = newTableWatch(cfg.OnOtherTable)
	}
	if err := a.refresh(ctx); err != nil {
		return nil, false, err
	}
	return a, creates, nil
}

// Target is the target table as last inspected (nil in sql mode and with tables).
func (a *Applier) Target() *Target {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.target
}

// targets lists the targets as last inspected: the one table, or with tables those met so far.
func (a *Applier) targets() []*Target {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok := a.handler.(*routedMode); ok {
		return r.targetList()
	}
	if a.target == nil {
		return nil
	}
	return []*Target{a.target}
}

// skipped tells, once per table, that events of table are skipped (on_unmapped_table: skip).
func (a *Applier) skipped(table string) {
	a.mu.Lock()
	told := a.skippedTables[table]
	a.skippedTables[table] = true
	a.mu.Unlock()
	if !told && a.cfg.OnUnmapped != nil {
		a.cfg.OnUnmapped(table)
	}
}

// keysFor is the watch of the payload keys that name no column of table (as the warnings name
// it), nil when they are ignored.
func (a *Applier) keysFor(table string) *unknownKeys {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[table]
	if !ok {
		k = newUnknownKeys(&a.cfg, table)
		a.keys[table] = k
	}
	return k
}

// needs lists what the mode requires of the table.
func (a *Applier) needs() TargetNeeds {
	n := TargetNeeds{Key: a.cfg.Key, Columns: a.cfg.Metadata.names(), Privileges: []string{"INSERT"}}
	switch a.cfg.Mode {
	case ModeUpsert:
		n.NeedKey = true
		n.Privileges = append(n.Privileges, "UPDATE", "SELECT")
	case ModeCDC:
		n.NeedKey = true
		n.Privileges = append(n.Privileges, "UPDATE", "SELECT", "DELETE")
	}
	return n
}

// refresh re-reads the target and rebuilds the mode (its statement cache goes with the old shape).
// With tables it reads the targets of the entries by name, and the others again as their events
// come (resolve).
func (a *Applier) refresh(ctx context.Context) error {
	if a.cfg.routes != nil {
		r := &routedMode{routes: *a.cfg.routes, targets: map[string]*routed{}}
		if a.cfg.SkipUnmapped {
			r.skip = a.skipped
		}
		for _, e := range a.cfg.routes.schemaEntries() {
			if err := checkSchema(ctx, a.pool, e.schema, e.entry); err != nil {
				return err
			}
		}
		for _, table := range a.cfg.routes.names() {
			target, _ := r.routes.Target(table)
			to, err := a.routeTo(ctx, r, target)
			if err != nil {
				return err
			}
			r.targets[table] = to
		}
		a.mu.Lock()
		a.target, a.handler, a.stale = nil, r, false
		a.mu.Unlock()
		return nil
	}
	var t *Target
	if a.cfg.Mode != ModeSQL {
		var err error
		if t, err = Inspect(ctx, a.pool, a.cfg.Table, a.needs()); err != nil {
			return err
		}
	} else if err := a.checkStatement(ctx); err != nil {
		return err
	}
	var keys *unknownKeys
	if t != nil {
		keys = a.keysFor(a.cfg.Table)
	}
	h, err := newModeHandler(&a.cfg, t, keys)
	if err != nil {
		return err
	}
	if c, ok := h.(cdcMode); ok && a.otherTables != nil {
		c.tables = a.otherTables
		h = c
	}
	a.mu.Lock()
	a.target, a.handler, a.stale = t, h, false
	a.mu.Unlock()
	return nil
}

// checkStatement prepares the sql mode's statements once at start, so a typo, a missing table or a
// wrong number of params is a coded error before any message is read.
func (a *Applier) checkStatement(ctx context.Context) error {
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("check statement: %w", err)
	}
	defer conn.Release()
	parts := splitStatement(a.cfg.Statement)
	for i, p := range parts {
		which := "the statement"
		if len(parts) > 1 {
			which = fmt.Sprintf("statement %d of %d (%s)", i+1, len(parts), excerpt([]byte(p.sql)))
		}
		sd, err := conn.Conn().Prepare(ctx, "", p.sql)
		if err != nil {
			if Classify(err) == Transient {
				return fmt.Errorf("check statement: %w", err)
			}
			return errcode.Wrap(errcode.SQLStatement, DataError(err), "PostgreSQL refuses "+which,
				"fix `statement` (and the objects it names, and the sink user's privileges)")
		}
		if len(sd.ParamOIDs) != len(p.params) {
			return errcode.New(errcode.SQLParamsMismatch, fmt.Sprintf("%s takes %d parameters but names %d", which, len(sd.ParamOIDs), len(p.params)),
				"give exactly one params entry per $n, in order")
		}
	}
	return nil
}

// current is the mode for a batch: rebuilt when a target's shape changed (checked at most once a
// second) or an error made it stale. With tables, the targets of tables met for the first time are
// found as their events are decoded (decodeResolving).
func (a *Applier) current(ctx context.Context) (modeHandler, error) {
	targets := a.targets()
	a.mu.Lock()
	stale, h := a.stale, a.handler
	due := len(targets) > 0 && time.Since(a.checked) > shapeCheckInterval
	if due {
		a.checked = time.Now()
	}
	a.mu.Unlock()
	if due && !stale {
		oids := make([]uint32, len(targets))
		for i, t := range targets {
			oids[i] = t.OID
		}
		v, err := shapeVersions(ctx, a.pool, oids)
		if err != nil {
			return nil, err
		}
		for _, t := range targets {
			stale = stale || v[t.OID] != t.Version
		}
	}
	if stale {
		if err := a.refresh(ctx); err != nil {
			return nil, err
		}
		a.mu.Lock()
		h = a.handler
		a.mu.Unlock()
	}
	return h, nil
}

// Write applies a batch: one transaction with the progress rows, retried inside on transient and
// environment errors until it commits or ctx ends (then a "paused" error: nothing was applied and
// no message is to blame). Data errors come back in the Result, not as the error.
func (a *Applier) Write(ctx context.Context, msgs []*Message) (*Result, error) {
	if err := a.checkPositions(msgs); err != nil {
		return nil, err
	}
	isolate, immediate := false, false
	wait := 100 * time.Millisecond
	var cause error // the error the batch is being retried after, if one was
	var causeClass Class
	for {
		res, err := a.attempt(ctx, msgs, isolate, immediate)
		if err == nil {
			return res, nil
		}
		if isCtxErr(ctx, err) {
			if cause != nil {
				// cut short while retrying: what the user must fix is the pause's cause, not the
				// shutdown that ended its retries
				return nil, stopped(cause, causeClass)
			}
			return nil, errcode.Wrap(errcode.Paused, err, "the batch was not written before shutdown", "none: the input redelivers it")
		}
		class := Classify(err)
		if class == Transient {
			if explained := pgconnect.Explain(err); errcode.Is(explained, errcode.PGUnreachable) {
				// no connection to be had: the caller waits for the server and writes the batch again
				return nil, fmt.Errorf("%w: %w", ErrUnreachable, explained)
			}
		}
		if class == Data && !isolate {
			isolate = true // find the culprit message by message, at once
			continue
		}
		if class == Data && !immediate {
			// a data error that no message's savepoint caught: a deferred constraint failed at
			// COMMIT; check constraints at each message's end to charge it to its message
			immediate = true
			continue
		}
		if class != Transient {
			class = Environment
			err = a.explain(ctx, err)
			a.mu.Lock()
			a.stale = true
			a.mu.Unlock()
		}
		cause, causeClass = err, class
		sleep := wait/2 + rand.N(wait/2+1)
		a.onRetry(err, class, sleep)
		select {
		case <-ctx.Done():
			return nil, stopped(err, class)
		case <-time.After(sleep):
		}
		wait = min(2*wait, a.cfg.RetryMax)
	}
}

// stopped is what Write returns when its context ends while the batch is retried after err (of
// class): under paused, err itself, whose code and fix say what to do when it paused the sink, or
// named as what the retries were for when it was transient.
func stopped(err error, class Class) error {
	if class == Transient {
		return errcode.Wrap(errcode.Paused, err, "the batch was not written before shutdown, retried after a transient error",
			"none: the input redelivers the batch")
	}
	return errcode.Wrap(errcode.Paused, err, "the sink is paused by an error and the batch was not written",
		"fix the cause; the input redelivers the batch and nothing is dead-lettered")
}

// ErrUnreachable is what Write returns, having written nothing, when a connection to PostgreSQL
// could not be opened (pg_unreachable, wrapped): rather than retry inside Write, the output reports
// itself not connected, waits until the server answers, and writes the batch again.
var ErrUnreachable = errors.New("pg_sink: PostgreSQL does not answer")

// explain codes an environment error. A refused privilege (42501) is named with its GRANT when the
// catalog shows which one is missing: on the progress table, on the target for the mode, or else
// TRUNCATE, which a cdc sink needs only once a truncate event arrives.
func (a *Applier) explain(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return environmentError(err)
	}
	missing := a.progress.checkPrivileges(ctx, a.pool)
	for _, t := range a.targets() {
		if missing != nil {
			break
		}
		privs := a.needs().Privileges
		if missing = t.checkPrivileges(ctx, a.pool, t.OID, privs); missing == nil && a.cfg.Mode == ModeCDC {
			missing = t.checkPrivileges(ctx, a.pool, t.OID, []string{"TRUNCATE"})
		}
	}
	var coded *errcode.Error
	if errors.As(missing, &coded) {
		coded.Err = err
		return coded
	}
	return environmentError(err)
}

// checkPositions refuses messages without queue/shard/offset unless require_progress is false.
func (a *Applier) checkPositions(msgs []*Message) error {
	if !a.cfg.RequireProgress {
		return nil
	}
	for _, m := range msgs {
		if !m.HasPosition {
			return errcode.New(errcode.NoProgressMetadata,
				"a message has no queue/shard/offset metadata, so the sink cannot write it exactly once",
				"read from the redis_queue input, or set require_progress: false to write such messages at-least-once")
		}
	}
	return nil
}

// batchState tracks one attempt's decisions per message.
type batchState struct {
	res      *Result
	blocked  map[ShardKey]int64 // shard → offset of the failed message that blocks it
	advanced map[ShardKey]int64
	pause    error // unknown_keys: pause met a key the table has no column for: the batch waits
}

func (s *batchState) set(i int, o Outcome, err error) {
	s.res.Outcomes[i], s.res.Errs[i] = o, err
}

func (s *batchState) fail(i int, m *Message, err error) {
	s.set(i, Failed, err)
	if m.HasPosition {
		s.blocked[m.shardKey()] = m.Offset
	}
}

func (s *batchState) block(i int, m *Message) bool {
	at, ok := s.blocked[m.shardKey()]
	if !m.HasPosition || !ok {
		return false
	}
	s.set(i, Blocked, errcode.New(errcode.Blocked,
		fmt.Sprintf("not applied: offset %d of shard %d of queue %s failed before it in this batch", at, m.Shard, m.Queue),
		"none: it is redelivered after the failed message is resolved"))
	return true
}

func (s *batchState) applied(i int, m *Message) {
	s.set(i, Applied, nil)
	if m.HasPosition && m.Offset > s.advanced[m.shardKey()] {
		s.advanced[m.shardKey()] = m.Offset
	}
}

// attempt runs the batch's transaction once. With isolate, each message runs under its own
// savepoint so a data error is charged to its message only.
//
// An append batch first tries the streamed COPY (see streamed), which decodes its payloads while
// they are sent. A batch whose payloads all decode takes the fast path first (one round trip, see
// fast); the others, and batches the fast path's guard refuses, lock and read their progress rows first (one
// round trip with BEGIN), then send the statements, the progress update and COMMIT (another).
//
// With immediate (isolate only), deferrable constraints are checked at each message's end (see
// applyEach), so one that a message violates fails that message, not the COMMIT.
func (a *Applier) attempt(ctx context.Context, msgs []*Message, isolate, immediate bool) (*Result, error) {
	h, err := a.current(ctx)
	if err != nil {
		return nil, err
	}
	c, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer release(c)
	conn := c.Conn()
	useTextArrayCodec(conn)
	tryFast := !isolate && !anyWithoutOffset(msgs) // sortOut fails those; the fast paths' guard would skip them
	if am, ok := h.(appendMode); ok && tryFast && am.w.stream.open() {
		res, next, err := a.streamed(ctx, conn, am.w, msgs)
		if next == streamDone {
			return res, err
		}
		tryFast = next == streamRegular
	}
	if tryFast && pieceBounds(len(msgs)) != nil && piecewiseMode(h) {
		res, next, err := a.piecewise(ctx, conn, h, msgs)
		if next == streamDone {
			return res, err
		}
		tryFast = next == streamRegular
	}
	ops := make([]op, len(msgs))
	decodeErr := make([]error, len(msgs))
	var shards []ShardKey
	seen := map[ShardKey]bool{}
	buf := newRowBuf(msgs)
	readable := true
	for i, m := range msgs {
		if ops[i], decodeErr[i], err = a.decodeResolving(ctx, &h, m, buf); err != nil {
			return nil, err
		}
		readable = readable && decodeErr[i] == nil
		if m.HasPosition && !seen[m.shardKey()] {
			seen[m.shardKey()] = true
			shards = append(shards, m.shardKey())
		}
	}
	if readable && tryFast {
		res, moved, err := a.fast(ctx, conn, h, msgs, ops)
		if !moved {
			return res, err
		}
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, err
		}
	}
	st := newBatchState(len(msgs))
	last, err := a.progress.Lock(ctx, conn, shards)
	if err != nil {
		return nil, err
	}
	pending := a.sortOut(msgs, decodeErr, last, st)
	if st.pause != nil {
		return nil, st.pause
	}
	if isolate && immediate {
		if _, err := conn.Exec(ctx, "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
			return nil, err
		}
	}
	if isolate {
		err = a.applyEach(ctx, conn, h, msgs, ops, pending, st, immediate)
	} else {
		err = a.applyAll(ctx, conn, h, msgs, ops, pending, st)
	}
	if err != nil {
		return nil, err
	}
	st.res.count()
	return st.res, nil
}

// decodeMessage decodes m for h, refusing a payload over the sink's limit first.
func decodeMessage(h modeHandler, m *Message, buf *rowBuf) (op, error) {
	if err := checkSize(m); err != nil {
		return op{}, err
	}
	return h.decode(m, buf)
}

// decodeResolving decodes m for *h; with tables, an event of a table met for the first time that
// an entry maps has its target inspected (resolve), *h becoming the mode that knows it, and m is
// decoded again. err is not m's: the target could not be inspected, and the batch waits.
func (a *Applier) decodeResolving(ctx context.Context, h *modeHandler, m *Message, buf *rowBuf) (o op, decodeErr, err error) {
	for {
		o, decodeErr = decodeMessage(*h, m, buf)
		u, ok := errors.AsType[*unresolvedError](decodeErr)
		if !ok {
			return o, decodeErr, nil
		}
		next, err := a.resolve(ctx, (*h).(*routedMode), u.table)
		if err != nil {
			return op{}, nil, err
		}
		*h = next
	}
}

func newBatchState(n int) *batchState {
	return &batchState{res: &Result{Outcomes: make([]Outcome, n), Errs: make([]error, n)},
		blocked: map[ShardKey]int64{}, advanced: map[ShardKey]int64{}}
}

// fast writes a batch whose payloads all decode in one round trip: BEGIN, the missing progress rows,
// a guard that locks the batch's progress rows and fails unless every shard's last_offset is below
// the batch's first offset for it, the statements, the progress update and COMMIT, in one
// pipeline. The guard passes unless the batch was (partly) applied before — a redelivery after a
// crash between commit and acknowledgement —, and then a statement has run and the returned error
// is the guard's (moved): the transaction is aborted, nothing was written, and the caller takes
// the path that reads the offsets before deciding what to skip. With the guard passed, no
// message is skipped except repeats inside the batch, exactly as that path would decide, and the
// locked rows cannot move before COMMIT. COPY (append mode) cannot join a pipeline: it follows as
// a second round trip, "COPY ...; COMMIT" in one query.
func (a *Applier) fast(ctx context.Context, conn *pgx.Conn, h modeHandler, msgs []*Message, ops []op) (res *Result, moved bool, err error) {
	st := newBatchState(len(msgs))
	pending, stmts, guard, shards := a.fastHead(msgs, st)
	batch := pendingOps(ops, pending)
	var copies []copyJob
	if am, ok := h.(appendMode); ok {
		if jobs, ok := am.copyPlan(batch); ok {
			copies, batch = jobs, nil
		}
	}
	data, err := h.plan(batch)
	if err != nil {
		return nil, false, err
	}
	stmts = append(stmts, data...)
	if adv, ok := a.progress.advanceStmt(st.advanced); ok {
		stmts = append(stmts, adv)
	}
	if len(copies) == 0 {
		stmts = append(stmts, stmt{sql: "COMMIT"})
	}
	if at, err := sendAt(ctx, conn, stmts); err != nil {
		return nil, at == guard && isGuardMoved(err), err
	}
	if len(copies) > 0 {
		if err := runCopies(ctx, conn, copies, true); err != nil {
			return nil, false, err
		}
	}
	a.progress.markKnown(shards)
	st.res.count()
	return st.res, false, nil
}

// fastHead sorts out a batch for the fast paths (no progress read yet, every payload decoded): it
// skips repeats inside the batch (an offset at or below an earlier one of its shard, as sortOut
// would), marks the rest applied, and returns them with the fast path's first statements: BEGIN and
// the guard (with the missing progress rows inserted before it), the guard's position in them (-1:
// no message has a position) and the shards it covers. One map lookup per run of messages of one
// shard, not several per message.
func (a *Applier) fastHead(msgs []*Message, st *batchState) (pending []int, stmts []stmt, guard int, shards []ShardKey) {
	type shard struct{ first, high int64 } // first: -1 until a message of the shard is pending
	at := map[ShardKey]*shard{}
	var cur *shard
	var curKey ShardKey
	pending = make([]int, 0, len(msgs))
	for i, m := range msgs {
		if !m.HasPosition {
			st.set(i, Applied, nil)
			pending = append(pending, i)
			continue
		}
		if k := m.shardKey(); cur == nil || k != curKey {
			if cur = at[k]; cur == nil {
				cur = &shard{first: -1}
				at[k] = cur
				shards = append(shards, k)
			}
			curKey = k
		}
		if m.Offset <= cur.high {
			st.set(i, Skipped, nil)
			continue
		}
		if cur.first < 0 {
			cur.first = m.Offset
		}
		cur.high = m.Offset
		st.set(i, Applied, nil)
		pending = append(pending, i)
	}
	first := make(map[ShardKey]int64, len(at))
	for k, sh := range at {
		if sh.first >= 0 {
			first[k] = sh.first
			st.advanced[k] = sh.high
		}
	}
	stmts = []stmt{{sql: "BEGIN"}}
	guard = -1
	if len(first) > 0 {
		stmts = append(stmts, a.progress.guardStmts(first)...)
		guard = len(stmts) - 1
	}
	return pending, stmts, guard, slices.Collect(maps.Keys(first))
}

// streamNext is what attempt does after streamed.
type streamNext int

const (
	streamDone    streamNext = iota // the batch is written, or failed with the returned error
	streamRegular                   // the batch did not fit the stream: take the fast path
	streamMoved                     // the guard refused: read the progress rows first
)

// streamPrefill is how many chunks of rows a streamed COPY encodes while the round trip before it
// runs.
const streamPrefill = 2

// streamed is the fast path of an append batch that goes by one COPY: BEGIN, the guard and the
// progress update in one round trip, then "COPY ...; COMMIT" with the rows decoded and encoded
// while they are sent (copyStream). The COPY's column set and format are those of the first row;
// when a later row does not fit, the transaction is rolled back and nothing was written.
func (a *Applier) streamed(ctx context.Context, conn *pgx.Conn, w *writer, msgs []*Message) (*Result, streamNext, error) {
	st := newBatchState(len(msgs))
	pending, stmts, guard, shards := a.fastHead(msgs, st)
	s, ok := w.newCopyStream(msgs, pending)
	if !ok {
		return nil, streamRegular, nil
	}
	if adv, ok := a.progress.advanceStmt(st.advanced); ok {
		stmts = append(stmts, adv)
	}
	// the first rows are decoded while PostgreSQL runs the guard
	if at, err := sendAtMeanwhile(ctx, conn, stmts, func() { s.prefill(streamPrefill) }); err != nil {
		if at != guard || !isGuardMoved(err) {
			return nil, streamDone, err
		}
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, streamDone, err
		}
		return nil, streamMoved, nil
	}
	var err error
	if !s.stopped.Load() {
		_, err = conn.PgConn().CopyFrom(ctx, s, s.sql+"; COMMIT")
	}
	if s.stopped.Load() {
		w.stream.pause()
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, streamDone, err
		}
		return nil, streamRegular, nil
	}
	if err != nil {
		return nil, streamDone, err
	}
	a.progress.markKnown(shards)
	st.res.count()
	return st.res, streamDone, nil
}

// pendingOps is the ops at the pending positions (ascending): ops itself when every message is
// pending, the usual case, so a batch's ops (about 200 bytes each) are not copied; plans only read
// them.
func pendingOps(ops []op, pending []int) []op {
	if len(pending) == len(ops) {
		return ops
	}
	batch := make([]op, len(pending))
	for j, i := range pending {
		batch[j] = ops[i]
	}
	return batch
}

// sortOut marks skipped, unreadable and blocked messages and returns the rest in batch order.
func (a *Applier) sortOut(msgs []*Message, decodeErr []error, last map[ShardKey]int64, st *batchState) []int {
	high := make(map[ShardKey]int64, len(last))
	for k, v := range last {
		high[k] = v
	}
	pending := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if st.block(i, m) {
			continue
		}
		if m.HasPosition && m.Offset < 1 {
			st.fail(i, m, errNoOffset(m))
			continue
		}
		if m.HasPosition && m.Offset <= high[m.shardKey()] {
			st.set(i, Skipped, nil)
			continue
		}
		if decodeErr[i] != nil {
			if isUnknownKeyPause(decodeErr[i]) && st.pause == nil {
				st.pause = decodeErr[i] // the table lacks a column: the batch waits, no message fails
			}
			st.fail(i, m, decodeErr[i])
			continue
		}
		if m.HasPosition {
			high[m.shardKey()] = m.Offset
		}
		pending = append(pending, i)
	}
	return pending
}

// applyAll writes every pending message in set-based statements, sent in one pipeline with the
// progress update and COMMIT (COPY, when append mode can use it, follows as "COPY ...; COMMIT").
func (a *Applier) applyAll(ctx context.Context, conn *pgx.Conn, h modeHandler, msgs []*Message, ops []op, pending []int, st *batchState) error {
	batch := pendingOps(ops, pending)
	for _, i := range pending {
		st.applied(i, msgs[i])
	}
	var copies []copyJob
	if am, ok := h.(appendMode); ok {
		if jobs, ok := am.copyPlan(batch); ok {
			copies, batch = jobs, nil
		}
	}
	stmts, err := h.plan(batch)
	if err != nil {
		return err
	}
	if adv, ok := a.progress.advanceStmt(st.advanced); ok {
		stmts = append(stmts, adv)
	}
	if len(copies) == 0 {
		return send(ctx, conn, append(stmts, stmt{sql: "COMMIT"}))
	}
	if err := send(ctx, conn, stmts); err != nil {
		return err
	}
	return runCopies(ctx, conn, copies, true)
}

// applyEach applies message by message under savepoints: a data error rolls back that message
// only and blocks the rest of its shard; any other error aborts the attempt. A message's ops are
// planned in their order where the mode can reorder them (orderedPlanner), and adjacent truncates
// go as one (one TRUNCATE at the source: tables that reference each other are emptied together).
//
// With immediate, deferrable constraints are checked at each message's end (deferred inside it,
// then SET CONSTRAINTS ALL IMMEDIATE, which checks what the message left pending): a violation
// fails its message, not the COMMIT, while a message that was one source transaction may still
// rely on the deferral inside it (an envelope writing an item before its order).
func (a *Applier) applyEach(ctx context.Context, conn *pgx.Conn, h modeHandler, msgs []*Message, ops []op, pending []int, st *batchState, immediate bool) error {
	plan := h.plan
	if o, ok := h.(orderedPlanner); ok {
		plan = o.planInOrder
	}
	var unit []int   // the messages applied together
	var unitOps []op // their ops
	for k := 0; k < len(pending); k++ {
		i := pending[k]
		if st.block(i, msgs[i]) {
			continue
		}
		unit, unitOps = append(unit[:0], i), append(unitOps[:0], ops[i])
		for ops[i].kind == opTruncate && k+1 < len(pending) && ops[pending[k+1]].kind == opTruncate && !st.block(pending[k+1], msgs[pending[k+1]]) {
			k++
			unit, unitOps = append(unit, pending[k]), append(unitOps, ops[pending[k]])
		}
		fail := func(err error) {
			for _, j := range unit {
				st.fail(j, msgs[j], DataError(err))
			}
		}
		stmts, err := plan(unitOps)
		if err != nil {
			if Classify(err) != Data {
				return err
			}
			fail(err) // nothing was sent: no savepoint to roll back
			continue
		}
		if immediate {
			stmts = append(append([]stmt{{sql: "SET CONSTRAINTS ALL DEFERRED"}}, stmts...), stmt{sql: "SET CONSTRAINTS ALL IMMEDIATE"})
		}
		stmts = append(append([]stmt{{sql: "SAVEPOINT pgrelay_msg"}}, stmts...), stmt{sql: "RELEASE SAVEPOINT pgrelay_msg"})
		if err = send(ctx, conn, stmts); err == nil {
			for _, j := range unit {
				st.applied(j, msgs[j])
			}
			continue
		}
		if Classify(err) != Data {
			return err
		}
		if _, rerr := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT pgrelay_msg"); rerr != nil {
			return rerr
		}
		if len(unitOps) == 1 && unitOps[0].kind == opEnvelope {
			var rerr error
			if err, rerr = refusedEvent(ctx, conn, plan, unitOps[0], err, immediate); rerr != nil {
				return rerr
			}
		}
		fail(err)
	}
	var stmts []stmt
	if adv, ok := a.progress.advanceStmt(st.advanced); ok {
		stmts = append(stmts, adv)
	}
	return send(ctx, conn, append(stmts, stmt{sql: "COMMIT"}))
}

// refusedEvent names the event of an envelope that PostgreSQL refused (err: the envelope's error,
// its statements being set-based): each event is planned alone, their statements go in order in
// one pipeline inside a savepoint rolled back afterwards, and the event of the first statement
// refused gives the error, as "envelope event <i>". When none is refused (the error arose from the
// events together, or from a deferred constraint at the envelope's end, which no one event is
// charged with), err is returned as it is. With deferred, deferrable constraints are deferred
// during the replay, as during the envelope. An error that is not the data's (rerr) ends the
// batch's attempt.
func refusedEvent(ctx context.Context, conn *pgx.Conn, plan func([]op) ([]stmt, error), env op, err error, deferred bool) (named, rerr error) {
	stmts := []stmt{{sql: "SAVEPOINT pgrelay_msg"}}
	of := []int{-1} // the event of each statement
	if deferred {
		stmts, of = append(stmts, stmt{sql: "SET CONSTRAINTS ALL DEFERRED"}), append(of, -1)
	}
	for i := range env.sub {
		s, perr := plan(env.sub[i : i+1])
		if perr != nil {
			return err, nil
		}
		stmts = append(stmts, s...)
		for range s {
			of = append(of, i)
		}
	}
	named = err
	at, serr := sendAt(ctx, conn, stmts)
	if serr != nil {
		if Classify(serr) != Data || at < 0 || of[at] < 0 {
			return err, serr
		}
		named = fmt.Errorf("envelope event %d: %w", of[at], DataError(serr))
	}
	if _, rerr := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT pgrelay_msg"); rerr != nil {
		return err, rerr
	}
	return named, nil
}

func (r *Result) count() {
	for _, o := range r.Outcomes {
		switch o {
		case Applied:
			r.Applied++
		case Skipped:
			r.Skipped++
		case Failed:
			r.Failed++
		case Blocked:
			r.Blocked++
		}
	}
}

// release returns a batch's connection to the pool, rolling back a transaction left open by an
// error (if that fails too, the pool discards the connection).
func release(c *pgxpool.Conn) {
	if conn := c.Conn(); !conn.IsClosed() && !conn.PgConn().IsBusy() && conn.PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = conn.Exec(ctx, "ROLLBACK")
		cancel()
	}
	c.Release()
}

// anyWithoutOffset reports whether a message has a queue position whose offset is below 1: its
// entry lacks the layout's off field (written by a producer other than pgrelay's output).
func anyWithoutOffset(msgs []*Message) bool {
	for _, m := range msgs {
		if m.HasPosition && m.Offset < 1 {
			return true
		}
	}
	return false
}

// errNoOffset is the failure of such a message: applied, it could not be told from a repeat
// (offsets start at 1, and the progress row's 0 means nothing applied), so it fails and goes to
// the dead letters after its attempts instead of being skipped as already applied.
func errNoOffset(m *Message) error {
	return errcode.New(errcode.BadMetadata,
		fmt.Sprintf("message %q (queue %s shard %d) has offset %d: its entry has no off field of 1 or more", m.MessageID, m.Queue, m.Shard, m.Offset),
		"write the queue through pgrelay's redis_queue output, or give every entry the layout's off field (docs/queue.md); this one goes to the dead letters after max_attempts")
}
