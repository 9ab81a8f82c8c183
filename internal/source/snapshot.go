package source

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/follow"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// WatermarkPrefix is the logical message prefix of the snapshot's watermarks. Only
// non-transactional messages with this prefix and this life's chunk id count.
const WatermarkPrefix = "pgrelay_snapshot"

// snapshotLogEvery is how often a snapshot waiting for earlier transactions says so.
const snapshotLogEvery = 5 * time.Second

// snapTable is what the snapshotter knows about one table: how to read it and how to render it.
type snapTable struct {
	info   *TableInfo
	full   string
	spec   snapshot.Spec
	enc    *event.Table // spec.Columns with their types, the key and the partition columns
	isKey  []bool       // per column of spec.Columns
	nonKey []string
	xmin   bool // the role may read the rows' xmin (SELECT on the whole table)
	// rowBytes is the mean bytes of values per row of the table's last chunk (0: no chunk of it
	// read since pg_cdc started), which sizes its next chunk (limit).
	rowBytes int
}

// Chunk sizes. A chunk reads chunk_rows rows, or fewer when the table's rows are wide, so that its
// values stay about ChunkValueBytes: a chunk is held in memory twice (its values, then its
// rendered events) until it is in the queue, and a table of large documents must not take
// chunk_rows of them at once. The table's first chunk after pg_cdc starts reads at most
// FirstChunkRows rows to learn their width.
const (
	ChunkValueBytes = 2 << 20
	FirstChunkRows  = 16
)

// limit is the most rows the next chunk of t reads, given chunk_rows.
func (t *snapTable) limit(chunkRows int) int {
	if t.rowBytes == 0 {
		return min(chunkRows, FirstChunkRows)
	}
	return min(chunkRows, max(1, ChunkValueBytes/t.rowBytes))
}

// measure records the mean width of rows just read from t, which sizes its next chunks (limit).
func (t *snapTable) measure(rows *snapshot.Rows) {
	if n := rows.Len(); n > 0 {
		t.rowBytes = max(1, rows.Size()/n)
	}
}

// pendingChunk is the chunk between its low watermark and the moment the reader hands it over.
type pendingChunk struct {
	id     string
	win    *snapshot.Window
	table  *snapTable
	cursor snapshot.Cursor
	chunk  *snapshot.Chunk
	done   chan struct{} // closed once the reader pushed the chunk's items
	parts  int
	next   snapshot.Cursor
	over   bool // the snapshot ends with this chunk

	// Set before ready is closed: the chunk's rows rendered as `r` events for the high watermark
	// at hwAt (what emitting it returned), so the reader only sorts them out at the watermark.
	ready chan struct{}
	rows  *rowRender // the rows rendered up to their tails while they arrived (nil: render them all)
	hwAt  pglogrepl.LSN
	// early: every row read was last written by a transaction older than the slot's catalog_xmin
	// at an earlier read (snapshotter.horizon), so the chunk may go ahead of its watermarks (see
	// early). When it went ahead (wentEarly), its `r` events and fills carry the position it went
	// into the queue at, wentAt, as their lsn (see lsn).
	early     bool
	wentEarly bool
	wentAt    pglogrepl.LSN
	events    []Event
	size      int // bytes of events (Event.size)
	readSize  int // bytes of the chunk's values
}

// snapshotter reads the tables chunk by chunk while the session streams (DESIGN §5).
type snapshotter struct {
	ss        *session
	pool      *pgxpool.Pool
	flushArg  bool // pg_logical_emit_message has the flush argument (PostgreSQL 17+)
	life      string
	epoch     string
	n         uint64
	tables    map[string]*snapTable
	reg       *convert.Registry
	startS    uint64
	pushed    atomic.Uint64 // parts handed to the bundler in this life
	acked     atomic.Uint64 // the acknowledged pointer's snapshot chunk count
	ackSignal chan struct{}

	mu      sync.Mutex
	pending []*pendingChunk // chunks past their low watermark's emission, in watermark order
	active  string          // the table being read, for collecting stream effects
	txXid   uint32
	txOther bool // the transaction being observed has events the active table's effects do not hold
	effects []snapshot.Effect
	trunc   bool
	history []snapshot.Commit // commits on the active table not yet seen by a chunk's snapshot
	// decoded holds the xids of commits with changes on other tables than the active one (or in an
	// envelope) that no chunk's snapshot has seen yet; switchWait is what it held, with the
	// transaction being observed, when the active table last changed: the next table's first chunk
	// waits until these are visible (waitSwitch).
	decoded    []uint32
	switchWait []uint32
	share      share         // when the next chunk may be read
	turn       chan struct{} // signalled when the reader reached or handed over a chunk
	over       atomic.Bool   // the snapshot is done: the reader has nothing to collect

	arena arena // fills and the rows' keys (build runs on the reader goroutine)

	renders chan *rowRender        // renderers free for the next chunk, kept with their buffers
	bufs    chan *snapshot.Buffers // memory of chunks handed over, free for the next reads

	progress *tableProgress // the table being read (run's goroutine only)

	// horizon is the slot's catalog_xmin, read with the last chunk (run's goroutine only): every
	// transaction older than it ended before a running-transactions record at or before the slot's
	// confirmed position then, which the stream has passed, and every position it reaches later
	// (0: none read yet).
	horizon uint32
	lastHW  pglogrepl.LSN // the last chunk's high watermark (run's goroutine only)
	// streamAt is the reader's position at its last look for an early chunk.
	streamAt atomic.Uint64
}

// newSnapshotter prepares the snapshot of the cursor in start (nil when there is none).
func (ss *session) newSnapshotter(pool *pgxpool.Pool, tables []TableInfo, version int) (*snapshotter, *snapshot.Cursor, error) {
	raw := ss.plan.Snapshot
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	var cur snapshot.Cursor
	if err := json.Unmarshal(raw, &cur); err != nil || cur.Table == "" {
		return nil, nil, fmt.Errorf("the pointer's snapshot cursor is unreadable: %s", raw)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	sn := &snapshotter{ss: ss, pool: pool, flushArg: version >= 170000, life: hex.EncodeToString(b[:]), epoch: ss.plan.Epoch,
		tables: map[string]*snapTable{}, reg: convert.NewRegistry(), startS: ss.plan.SnapshotChunks,
		ackSignal: make(chan struct{}, 1), turn: make(chan struct{}, 1), renders: make(chan *rowRender, 4),
		bufs: make(chan *snapshot.Buffers, 4)}
	sn.acked.Store(ss.plan.SnapshotChunks)
	sn.share.acked = ss.plan.SnapshotChunks
	for i := range tables {
		sn.tables[tables[i].Full()] = &snapTable{info: &tables[i], full: tables[i].Full()}
	}
	sn.active = cur.Table
	return sn, &cur, nil
}

// load reads the table's columns and types once.
func (sn *snapshotter) load(ctx context.Context, name string) (*snapTable, error) {
	t := sn.tables[name]
	if t == nil { // removed from tables while its snapshot ran: skipped (read as an empty chunk)
		sn.ss.src.log.Warnf("snapshot: %s is no longer in tables, skipping it", name)
		return nil, nil
	}
	if len(t.info.Key) == 0 { // append-only without a key: nothing tells a copied row from a streamed insert
		sn.ss.src.log.Warnf("snapshot: %s is append-only without a key, so its existing rows are not copied (only its inserts are streamed)",
			name)
		return nil, nil
	}
	if t.enc != nil {
		return t, nil
	}
	rows, err := sn.pool.Query(ctx, `SELECT attname, atttypid, format_type(atttypid, atttypmod)
		FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
		ORDER BY attnum`, t.info.OID)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: read columns: %w", name, err)
	}
	var cols []snapshot.Column
	for rows.Next() {
		var c snapshot.Column
		if err := rows.Scan(&c.Name, &c.TypeOID, &c.SQLType); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot %s: read columns: %w", name, err)
		}
		if len(t.info.ColumnList) == 0 || slices.Contains(t.info.ColumnList, c.Name) { // the published columns only
			cols = append(cols, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot %s: read columns: %w", name, err)
	}
	oids := make([]uint32, len(cols))
	for i, c := range cols {
		oids[i] = c.TypeOID
	}
	if err := sn.reg.Load(ctx, sn.pool, oids); err != nil {
		return nil, err
	}
	// A role granted SELECT on some columns only cannot read xmin: its chunks never go early.
	if err := sn.pool.QueryRow(ctx, `SELECT pg_catalog.has_table_privilege($1::oid, 'SELECT')`, t.info.OID).Scan(&t.xmin); err != nil {
		return nil, fmt.Errorf("snapshot %s: read privileges: %w", name, err)
	}
	t.spec = snapshot.Spec{Schema: t.info.Schema, Name: t.info.Name, Columns: cols, Key: t.info.Key}
	ecols := make([]event.Column, len(cols))
	for i, c := range cols {
		ecols[i] = event.Column{Name: c.Name, Type: sn.reg.Lookup(c.TypeOID)}
	}
	index := func(names []string) []int {
		out := make([]int, 0, len(names))
		for _, n := range names {
			for j, c := range cols {
				if c.Name == n {
					out = append(out, j)
				}
			}
		}
		return out
	}
	key, part := index(t.info.Key), []int(nil)
	switch t.info.Mode {
	case PartitionByKey:
		part = key
	case PartitionByColumns:
		part = index(t.info.Columns)
	}
	t.enc = event.NewTable(name, ecols, key, part)
	t.isKey = make([]bool, len(cols))
	for _, k := range key {
		t.isKey[k] = true
	}
	for i, c := range cols {
		if !t.isKey[i] {
			t.nonKey = append(t.nonKey, c.Name)
		}
	}
	return t, nil
}

// run reads chunks until the snapshot is done or the session ends. Chunks are read ahead of the
// stream: a chunk's rows go into the queue when the WAL reader reaches its high watermark, and
// meanwhile the next chunks may be read (as the share allows, see share).
func (sn *snapshotter) run(cur snapshot.Cursor) error {
	ctx := sn.ss.ctx
	src := sn.ss.src
	src.log.Infof("snapshot of %d table(s) at %s (%d rows done)", len(cur.Tables), cur.Table, cur.Rows)
	if err := sn.waitEarlierTransactions(ctx); err != nil {
		return err
	}
	if err := sn.readHorizon(ctx); err != nil {
		return err
	}
	sn.trackTable(ctx, cur)
	defer src.setSnapshotProgress(nil)
	for table := cur.Table; ; {
		if err := sn.waitTurn(ctx, cur.Table); err != nil {
			return err
		}
		if cur.Table != table { // the stream's effects are collected for this table from now on
			table = cur.Table
			if err := sn.waitSwitch(ctx, table); err != nil {
				return err
			}
		}
		t, err := sn.load(ctx, cur.Table)
		if err != nil {
			return err
		}
		p, err := sn.chunk(ctx, t, cur)
		if err != nil {
			return err
		}
		if p.next.Table != cur.Table || p.over {
			src.log.Infof("snapshot of %s read (%d rows)", cur.Table, cur.Rows+int64(p.chunk.Rows.Len()))
		}
		if p.over { // the last chunk: done once it is acknowledged
			if err := sn.waitHanded(ctx); err != nil {
				return err
			}
			if err := sn.waitAcked(ctx, sn.startS+sn.pushed.Load()); err != nil {
				return err
			}
			src.log.Infof("snapshot done")
			src.setSnapshotProgress(nil)
			src.setPhase(PhaseStreaming, nil)
			return nil
		}
		if p.next.Table != cur.Table {
			sn.trackTable(ctx, p.next)
		}
		cur = p.next
		sn.report(cur.Rows)
	}
}

// waitEarlierTransactions waits until every transaction in progress now has ended. A table added
// to the publication has its changes published only from the ALTER PUBLICATION on: a transaction
// that changed it before that and commits later is never in the stream, and a chunk read before
// its commit would keep the old row for good. Once such transactions are over, every chunk's read
// includes what they did. (The session's publication check ran just before this; a new slot has
// waited for the same when it was created.)
//
// It also covers commits decoded before this replication run started: a commit record reaches the
// stream before its transaction leaves the proc array (a synchronous standby can hold it there for
// long), so such a transaction, already in the queue, may still be invisible to the next chunk's
// snapshot, whose old row would then follow its event. follow.WaitCommitted waits for those too:
// pg_snapshot_xip alone misses a held commit at or above the snapshot's xmax. Later table switches
// wait for the commits the stream decoded only (waitSwitch).
func (sn *snapshotter) waitEarlierTransactions(ctx context.Context) error {
	conn, err := sn.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: wait for the transactions in progress: %w", err)
	}
	defer conn.Release()
	lastLog := time.Now()
	err = follow.WaitCommitted(ctx, conn.Conn().PgConn(), func(xids []string) {
		if time.Since(lastLog) >= snapshotLogEvery {
			lastLog = time.Now()
			sn.ss.src.log.Infof("snapshot waits for transaction(s) %s, begun before it started, to end",
				strings.Join(xids, ", "))
		}
	})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// waitSwitch runs before the first chunk of a table after the first: it waits until every commit
// the stream decoded before the table's effects were collected (switchWait, taken when it became
// the active table), and not yet seen by a chunk's snapshot, is visible. The snapshotter collects
// the stream's effects for one table at a time, and a commit is decoded before new snapshots see
// it (a synchronous standby can hold it there for long): a chunk that did not see such a commit
// would put the row's old state in the queue after its event. Commits decoded later are in the
// table's history, which every chunk's window checks against the chunk's snapshot. Transactions
// still open are not waited for: their commits come later in the stream, inside or after the
// chunks' windows.
func (sn *snapshotter) waitSwitch(ctx context.Context, table string) error {
	sn.mu.Lock()
	xids := sn.switchWait
	sn.switchWait = nil
	sn.mu.Unlock()
	if len(xids) == 0 {
		return nil
	}
	conn, err := sn.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: wait for the commits decoded before %s: %w", table, err)
	}
	defer conn.Release()
	lastLog := time.Now()
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		var text string
		if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_current_snapshot()::text`).Scan(&text); err != nil {
			return fmt.Errorf("snapshot: wait for the commits decoded before %s: %w", table, err)
		}
		snap, err := snapshot.ParseSnapshot(text)
		if err != nil {
			return fmt.Errorf("snapshot: wait for the commits decoded before %s: %w", table, err)
		}
		if xids = slices.DeleteFunc(xids, snap.Sees); len(xids) == 0 {
			return nil
		}
		if time.Since(lastLog) >= snapshotLogEvery {
			lastLog = time.Now()
			var shown []string
			for _, x := range xids[:min(len(xids), 20)] {
				shown = append(shown, strconv.FormatUint(snap.Widen(x), 10))
			}
			sn.ss.src.log.Infof("snapshot of %s waits for transaction(s) %s, already in the stream, to become visible (a synchronous standby has not confirmed them)",
				table, strings.Join(shown, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// waitTurn waits until the next chunk, of table, may be read (see mayRead).
func (sn *snapshotter) waitTurn(ctx context.Context, table string) error {
	for !sn.mayRead(table) {
		select {
		case <-sn.turn:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// mayRead reports whether the next chunk, of table, may be read now: the share allows it and,
// when the table changes, the reader reached every chunk of the previous table (the stream's
// effects are collected for one table at a time). The turn channel signals every change that
// may allow it.
func (sn *snapshotter) mayRead(table string) bool {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if table != sn.active && sn.share.inFlight == 0 {
		sn.setActiveLocked(table)
	}
	return table == sn.active && sn.share.mayStart()
}

// setActive makes table the one whose stream effects are collected ("" none).
func (sn *snapshotter) setActive(table string) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	sn.setActiveLocked(table)
}

func (sn *snapshotter) setActiveLocked(table string) {
	if table != "" && table != sn.active {
		sn.switchWait = slices.Clone(sn.decoded)
		if sn.txOther || len(sn.effects) > 0 || sn.trunc { // its earlier changes on table are not collected
			sn.switchWait = append(sn.switchWait, sn.txXid)
		}
	}
	sn.active, sn.effects, sn.trunc, sn.history = table, nil, false, nil
}

// waitHanded waits until the reader handed every chunk over.
func (sn *snapshotter) waitHanded(ctx context.Context) error {
	for {
		sn.mu.Lock()
		left := sn.share.unhanded
		sn.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-sn.turn:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// chunk starts one chunk: it opens its window, then in one round trip emits the low watermark,
// reads the chunk and emits the high watermark, and leaves the rendering of its rows to a
// goroutine. The WAL reader hands the chunk over at its high watermark.
func (sn *snapshotter) chunk(ctx context.Context, t *snapTable, cur snapshot.Cursor) (*pendingChunk, error) {
	p := sn.open(t, cur)
	if t != nil {
		select {
		case p.rows = <-sn.renders:
		default:
			p.rows = &rowRender{}
		}
		p.rows.reset(t)
	}
	chunk, hw, err := sn.readBetween(ctx, t, cur, p.id, p.rows)
	if err != nil {
		if t != nil && renamedAway(err) && sn.followRename(ctx, t) {
			sn.abandon(p)
			return sn.chunk(ctx, t, cur)
		}
		return nil, err
	}
	p.early = t != nil && chunk.XminRead && chunk.Young == 0 &&
		sn.ss.src.cfg.Envelope(t.info.Queue) == nil // an enveloped queue keeps its chunks at their high watermark, in commit order
	sn.prepare(p, chunk, hw)
	return p, nil
}

// followRename points t's chunk query at the table's name of now when the table (found by its
// oid) was renamed or moved to another schema since the query was built, and reports whether it
// was: the snapshot goes on under the new name, as the stream does, and the log says to set it in
// tables[].table. A dropped table keeps its name (false).
func (sn *snapshotter) followRename(ctx context.Context, t *snapTable) bool {
	schema, name, err := relationName(ctx, sn.pool, t.info.OID)
	if err != nil || name == "" || (schema == t.spec.Schema && name == t.spec.Name) {
		return false
	}
	t.spec.Schema, t.spec.Name = schema, name
	sn.ss.src.logRenamed(ctx, sn.pool, t.info, Table{Schema: schema, Name: name}.Full())
	return true
}

// abandon forgets chunk p, whose read failed before its snapshot was taken: its low watermark is
// in the WAL (the stream passes it as an unknown chunk's) and its high watermark is not, since the
// read's failed transaction refused that statement.
func (sn *snapshotter) abandon(p *pendingChunk) {
	sn.mu.Lock()
	sn.pending = slices.DeleteFunc(sn.pending, func(q *pendingChunk) bool { return q == p })
	sn.share.abandoned()
	sn.mu.Unlock()
	if p.rows != nil {
		select {
		case sn.renders <- p.rows:
		default:
		}
		p.rows = nil
	}
}

// lsn is the lsn of p's `r` and fill events for its high watermark hw: the position the chunk goes
// into the queue at, so that every change before them in the queue has a lower or equal lsn and
// every later one a higher one, in each partition. That is hw, or, for a chunk that went ahead of
// the stream, just past the stream's position there (wentAt). Not the low watermark: a commit
// written to the WAL before it that the chunk's read did not see (a synchronous standby holding
// it) comes after the chunk in the queue, and so may other keys' changes in a partition the chunk
// shares with them.
func (p *pendingChunk) lsn(hw pglogrepl.LSN) pglogrepl.LSN {
	if p.wentEarly {
		return p.wentAt
	}
	return hw
}

// open registers the next chunk before its low watermark is emitted: its window sees the commits
// no chunk's snapshot has seen yet, and every commit decoded from now on.
func (sn *snapshotter) open(t *snapTable, cur snapshot.Cursor) *pendingChunk {
	sn.n++
	p := &pendingChunk{id: sn.life + ":" + strconv.FormatUint(sn.n, 10), win: snapshot.NewWindow(), table: t, cursor: cur,
		done: make(chan struct{}), ready: make(chan struct{})}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	for _, c := range sn.history { // decoded earlier, perhaps still invisible to this chunk's read
		p.win.Observe(c)
	}
	sn.pending = append(sn.pending, p)
	sn.share.start()
	return p
}

// prepare takes the chunk read for p, whose high watermark is at hw, and renders its rows in a
// goroutine; ready is closed when they are.
func (sn *snapshotter) prepare(p *pendingChunk, chunk *snapshot.Chunk, hw pglogrepl.LSN) {
	p.next, p.over = p.cursor.Advance(chunk.Rows.Len(), chunk.LastKey, chunk.Limit)
	p.chunk, p.hwAt = chunk, hw
	p.readSize = chunk.Rows.Size()
	if p.table != nil {
		p.table.measure(&chunk.Rows)
	}
	sn.mu.Lock()
	sn.share.read(p.readSize)
	sn.mu.Unlock()
	go func() {
		if r := p.rows; r != nil && len(r.ends) == chunk.Rows.Len() {
			p.events, p.size = r.finish(sn.tx(hw), sn.position(p.lsn(hw), chunk), chunk.ReadAt.UnixMilli())
		} else {
			p.events, p.size = sn.render(p, hw)
		}
		if p.rows != nil {
			select {
			case sn.renders <- p.rows:
			default:
			}
			p.rows = nil
		}
		sn.mu.Lock()
		sn.share.rendered(p.size)
		sn.mu.Unlock()
		close(p.ready)
	}()
}

// readBetween reads one chunk between its watermarks and returns the high one's LSN; rows (when not nil)
// renders the rows as they arrive. While the stream is behind (sn.behind), the chunk also reads its
// rows' xmin, and the low watermark's group the slot's catalog_xmin into sn.horizon. A table no
// longer configured (nil) reads as an empty chunk, which moves the cursor to the next table.
func (sn *snapshotter) readBetween(ctx context.Context, t *snapTable, cur snapshot.Cursor, id string, rows *rowRender) (*snapshot.Chunk, pglogrepl.LSN, error) {
	if t == nil {
		if err := sn.watermark(ctx, id+":lw"); err != nil {
			return nil, 0, err
		}
		ch, _ := sn.read(ctx, nil, cur)
		return ch, 0, sn.watermark(ctx, id+":hw")
	}
	conn, err := sn.pool.Acquire(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	defer conn.Release()
	low := []snapshot.Stmt{{SQL: `SELECT pg_logical_emit_message(false, $1, $2)`, Args: []string{WatermarkPrefix, id + ":lw"}}}
	spec := t.spec
	if t.xmin && sn.behind() {
		// the rows are checked against the horizon of an earlier read (0: none yet), and the
		// horizon is read again for the next chunk
		spec.OlderThan = sn.horizon
		low = append(low, snapshot.Stmt{SQL: horizonSQL, Args: []string{sn.ss.src.cfg.Slot}})
	}
	high, at := sn.highStatements(id + ":hw")
	var each func([][]byte)
	if rows != nil {
		each = rows.add
	}
	var buf *snapshot.Buffers
	select {
	case buf = <-sn.bufs:
	default:
	}
	ch, marks, err := spec.ReadBetween(ctx, conn.Conn().PgConn(), cur.After, t.limit(sn.ss.src.cfg.ChunkRows), low, high, each, buf)
	if err != nil {
		return nil, 0, err
	}
	hw, err := pglogrepl.ParseLSN(string(marks[len(low)+at]))
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: the high watermark's LSN %q: %w", marks[len(low)+at], err)
	}
	if len(low) > 1 {
		sn.setHorizon(marks[1])
	}
	sn.lastHW = hw
	return ch, hw, nil
}

// horizonSQL reads the slot's catalog_xmin (snapshotter.horizon) as text, NULL before the slot
// has one.
const horizonSQL = `SELECT catalog_xmin::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`

// readHorizon reads the slot's catalog_xmin before the first chunk, so that chunk may go early too.
func (sn *snapshotter) readHorizon(ctx context.Context) error {
	var text *string
	err := sn.pool.QueryRow(ctx, horizonSQL, sn.ss.src.cfg.Slot).Scan(&text)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("snapshot: read the slot's catalog_xmin: %w", err)
	}
	if text != nil {
		sn.setHorizon([]byte(*text))
	}
	return nil
}

// setHorizon takes a catalog_xmin as text (nil or unreadable: the horizon stays).
func (sn *snapshotter) setHorizon(text []byte) {
	if x, ok := snapshot.ParseXid(text); ok && x >= snapshot.FirstNormalXid {
		sn.horizon = x
	}
}

// highStatements emit a high watermark flushed at once, so the stream sees it without waiting for
// the WAL writer: with the flush argument on 17+, and before 17 by committing a transaction that
// has an xid right after it (its commit flushes the WAL up to there; the transaction itself is
// empty, so pgoutput sends nothing or an empty transaction). That commit is local
// (synchronous_commit = local): it flushes the WAL here and never waits for a synchronous standby,
// which an empty transaction does not need, so a slow or silent standby does not hold every chunk.
// at is the statement returning the message's LSN.
func (sn *snapshotter) highStatements(content string) (stmts []snapshot.Stmt, at int) {
	args := []string{WatermarkPrefix, content}
	if sn.flushArg {
		return []snapshot.Stmt{{SQL: `SELECT pg_logical_emit_message(false, $1, $2, true)`, Args: args}}, 0
	}
	return []snapshot.Stmt{{SQL: `BEGIN`}, {SQL: `SET LOCAL synchronous_commit = local`},
		{SQL: `SELECT pg_logical_emit_message(false, $1, $2)`, Args: args},
		{SQL: `SELECT pg_current_xact_id()`}, {SQL: `COMMIT`}}, 2
}

// read reads one chunk; a table no longer configured (nil) reads as an empty chunk, which moves the
// cursor to the next table.
func (sn *snapshotter) read(ctx context.Context, t *snapTable, cur snapshot.Cursor) (*snapshot.Chunk, error) {
	if t == nil {
		return &snapshot.Chunk{ReadAt: time.Now().UTC()}, nil
	}
	conn, err := sn.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer conn.Release()
	return t.spec.Read(ctx, conn.Conn().PgConn(), cur.After, t.limit(sn.ss.src.cfg.ChunkRows))
}

// watermark emits a watermark on its own (a chunk of a table no longer configured has nothing to
// read between them); a high watermark is flushed as highStatements says.
func (sn *snapshotter) watermark(ctx context.Context, content string) error {
	stmts := []snapshot.Stmt{{SQL: `SELECT pg_logical_emit_message(false, $1, $2)`, Args: []string{WatermarkPrefix, content}}}
	if strings.HasSuffix(content, ":hw") {
		stmts, _ = sn.highStatements(content)
	}
	err := pgx.BeginFunc(ctx, sn.pool, func(tx pgx.Tx) error { // one transaction, as in a round trip's group
		for _, st := range stmts {
			if st.SQL == `BEGIN` || st.SQL == `COMMIT` {
				continue
			}
			args := make([]any, len(st.Args))
			for i, a := range st.Args {
				args[i] = a
			}
			if _, err := tx.Exec(ctx, st.SQL, args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("snapshot: emit watermark: %w", err)
	}
	return nil
}
