package sink

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A larger upsert or cdc batch goes in pieces: its first rows are decoded and planned, sent with
// BEGIN and the guard, and while PostgreSQL runs them the next piece is decoded and planned; the
// last piece goes with the progress update and COMMIT, all in one pipeline with one Sync, so the
// server never waits between pieces. It is still one transaction, with the same statements the
// one-pipeline fast path sends, only cut by message: a key met in two pieces is written by both
// statements in offset order, as the folder's rounds would. The sink's Go work per row (decoding
// the payload, mostly) then runs while PostgreSQL works instead of before it, which left the
// server idle for about a fifth of a 500-row batch's time.

// minPiece is the fewest messages a piece holds; a batch of fewer than 2 × minPiece goes whole.
const minPiece = 32

// pieceBounds cuts n messages into two pieces: the first, a quarter (at least minPiece), is
// decoded before anything is sent; the rest is decoded while the server runs the first (the
// server's time per row is several times the decoding's, so a quarter covers the rest). Nil when
// n is too small to cut.
func pieceBounds(n int) [][2]int {
	if n < 2*minPiece {
		return nil
	}
	first := max(minPiece, n/4)
	return [][2]int{{0, first}, {first, n}}
}

// piecewise is the fast path of an upsert or cdc batch in pieces (see above). Like streamed, it
// returns streamMoved when the guard refuses (the batch was partly applied before; nothing was
// written) and streamRegular when a payload does not decode or plan (rolled back, nothing written:
// the regular path decodes the batch and charges the message).
//
// The pieces go in one pipeline (piped): the first with BEGIN and the guard, the next as soon as
// it is planned, while PostgreSQL still runs the first, then the progress update and COMMIT, and
// one Sync; the server never waits for the client between pieces. A piece with a statement the
// connection has not prepared ends the pipeline and goes in a round trip of its own.
func (a *Applier) piecewise(ctx context.Context, conn *pgx.Conn, h modeHandler, msgs []*Message) (*Result, streamNext, error) {
	st := newBatchState(len(msgs))
	pending, head, guard, shards := a.fastHead(msgs, st)
	pieces := pieceBounds(len(pending))
	if pieces == nil {
		return nil, streamRegular, nil
	}
	buf := newRowBuf(msgs)
	ops := make([]op, len(pending))
	decoded := 0 // ops[:decoded] are decoded
	decode := func(to int) bool {
		for ; decoded < to; decoded++ {
			var err error
			if ops[decoded], err = decodeMessage(h, msgs[pending[decoded]], buf); err != nil {
				return false
			}
		}
		return true
	}
	plan := func(p [2]int) ([]stmt, bool) {
		if !decode(p[1]) {
			return nil, false
		}
		stmts, err := h.plan(ops[p[0]:p[1]])
		return stmts, err == nil
	}
	// adjacent truncates (one TRUNCATE at the source) stay in one piece, which plans them as one
	if !decode(pieces[0][1]) {
		return nil, streamRegular, nil
	}
	for cut := pieces[0][1]; cut < len(pending) && ops[cut-1].kind == opTruncate; cut++ {
		if !decode(cut + 1) {
			return nil, streamRegular, nil
		}
		if ops[cut].kind != opTruncate {
			break
		}
		pieces[0][1], pieces[1][0] = cut+1, cut+1
	}
	if pieces[0][1] == len(pending) {
		pieces = pieces[:1]
	}
	data, ok := plan(pieces[0])
	if !ok {
		return nil, streamRegular, nil
	}
	var tail []stmt // after the last piece
	if adv, ok := a.progress.advanceStmt(st.advanced); ok {
		tail = append(tail, adv)
	}
	tail = append(tail, stmt{sql: "COMMIT"})
	stmts := append(head, data...)
	pp, err := startPiped(ctx, conn, stmts, tail)
	if err != nil {
		return nil, streamDone, err
	}
	// settle reads the results of what was sent: ok, or how the batch ends (the guard's refusal
	// rolls the transaction back; any other error leaves it to the caller, who rolls it back)
	settle := func() (ok bool, res *Result, next streamNext, err error) {
		at, err := pp.finish()
		switch {
		case err == nil:
			return true, nil, streamDone, nil
		case at == guard && isGuardMoved(err):
			res, next, err = rollback(ctx, conn, streamMoved)
			return false, res, next, err
		}
		return false, nil, streamDone, err
	}
	for i := range pieces {
		last := i == len(pieces)-1
		if last {
			stmts = append(stmts, tail...)
		}
		if !pp.prepared(stmts) { // a statement new to the connection: settle what was sent, prepare it
			if ok, res, next, err := settle(); !ok {
				return res, next, err
			}
			if pp, err = startPiped(ctx, conn, stmts, tail); err != nil {
				return nil, streamDone, err
			}
		}
		if err := pp.send(stmts); err != nil {
			_, ferr := pp.finish()
			return nil, streamDone, errors.Join(err, ferr)
		}
		if last {
			if ok, res, next, err := settle(); !ok {
				return res, next, err
			}
			break
		}
		next, nextOK := plan(pieces[i+1]) // while PostgreSQL runs what was sent
		if !nextOK {
			if ok, res, next, err := settle(); !ok {
				return res, next, err
			}
			return rollback(ctx, conn, streamRegular)
		}
		stmts = next
	}
	a.progress.markKnown(shards)
	st.res.count()
	return st.res, streamDone, nil
}

// piped sends statements through one pipeline by their prepared descriptions: each send goes out
// at once, and the results are read once, after a single Sync (finish).
type piped struct {
	conn  *pgx.Conn
	pl    *pgconn.Pipeline
	descs map[string]*pgconn.StatementDescription
	eqb   pgx.ExtendedQueryBuilder
	sent  []string // the SQL of the statements sent, in order
}

// startPiped prepares the statements of lists (a statement new to the connection costs a round
// trip, once) and starts a pipeline to send them.
func startPiped(ctx context.Context, conn *pgx.Conn, lists ...[]stmt) (*piped, error) {
	pp := &piped{conn: conn, descs: map[string]*pgconn.StatementDescription{}}
	for _, list := range lists {
		for _, s := range list {
			if pp.descs[s.sql] != nil {
				continue
			}
			sd, err := conn.Prepare(ctx, s.sql, s.sql)
			if err != nil {
				return nil, err
			}
			pp.descs[s.sql] = sd
		}
	}
	pp.pl = conn.PgConn().StartPipeline(ctx)
	return pp, nil
}

// prepared reports whether every statement of stmts has its prepared description.
func (pp *piped) prepared(stmts []stmt) bool {
	for _, s := range stmts {
		if pp.descs[s.sql] == nil {
			return false
		}
	}
	return true
}

// send sends stmts, all prepared, and flushes them to the server. An argument that does not
// encode is an error (the statements before it are sent: the transaction is left open without its
// COMMIT and goes back rolled back).
func (pp *piped) send(stmts []stmt) error {
	m := pp.conn.TypeMap()
	for _, s := range stmts {
		sd := pp.descs[s.sql]
		if sd == nil {
			return errors.New("pg_sink: a statement of the pipeline was not prepared")
		}
		if err := pp.eqb.Build(m, sd, s.args); err != nil {
			return err
		}
		pp.pl.SendQueryStatement(sd, pp.eqb.ParamValues, pp.eqb.ParamFormats, pp.eqb.ResultFormats)
		pp.sent = append(pp.sent, s.sql)
	}
	_ = pp.pl.Flush() // a failed flush closes the pipeline: finish reports its error
	return nil
}

// finish ends the pipeline with a Sync and reads the results of what was sent: the index of the
// first statement that failed and its error (after an error the server skipped the rest, a COMMIT
// among them included), len(sent) for an error of the connection after them, or -1.
func (pp *piped) finish() (int, error) {
	at, first := -1, error(nil)
	if err := pp.pl.Sync(); err != nil {
		return len(pp.sent), errors.Join(err, pp.pl.Close())
	}
	for i, sql := range pp.sent {
		res, err := pp.pl.GetResults()
		if err == nil {
			if rr, ok := res.(*pgconn.ResultReader); ok {
				_, err = rr.Close()
			}
		}
		if err != nil {
			at, first = i, commitErr(sql, err)
			break
		}
	}
	if err := pp.pl.Close(); err != nil && first == nil {
		return len(pp.sent), err
	}
	return at, first
}

// piecewiseMode reports whether h's batches may go in pieces: upsert and cdc, whose plans apply
// ops in offset order with nothing that depends on the batch as a whole (append has its streamed
// COPY; sql mode runs the user's statements, which may read what the batch wrote).
func piecewiseMode(h modeHandler) bool {
	switch h.(type) {
	case upsertMode, cdcMode, *routedMode:
		return true
	}
	return false
}

// rollback ends the batch's transaction, which wrote nothing, and returns next.
func rollback(ctx context.Context, conn *pgx.Conn, next streamNext) (*Result, streamNext, error) {
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		return nil, streamDone, err
	}
	return nil, next, nil
}
