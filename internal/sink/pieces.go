package sink

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A larger upsert or cdc batch goes in pieces: its first rows are decoded and planned, sent with
// BEGIN and the guard, and while PostgreSQL runs them the next piece is decoded and planned; the
// last piece goes with the progress update and COMMIT. It is still one transaction, with the
// same statements the one-pipeline fast path sends, only cut by message: a key met in two pieces is
// written by both statements in offset order, as the folder's rounds would. The sink's Go work per
// row (decoding the payload, mostly) then runs while PostgreSQL works instead of before it, which
// left the server idle for about a fifth of a 500-row batch's time.

// minPiece is the fewest messages a piece holds; a batch of fewer than 2 × minPiece goes whole.
const minPiece = 32

// pieceBounds cuts n messages into two pieces: the first, a quarter (at least minPiece), is
// decoded before anything is sent; the rest is decoded while the server runs the first (the
// server's time per row is several times the decoding's, so a quarter covers the rest). Each more
// piece would cost a round trip in which the server waits. Nil when n is too small to cut.
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
func (a *Applier) piecewise(ctx context.Context, conn *pgx.Conn, h modeHandler, msgs []*Message) (*Result, streamNext, error) {
	st := newBatchState(len(msgs))
	pending, head, guard, shards := a.fastHead(msgs, st)
	pieces := pieceBounds(len(pending))
	if pieces == nil {
		return nil, streamRegular, nil
	}
	buf := newRowBuf(msgs)
	ops := make([]op, len(pending))
	plan := func(p [2]int) ([]stmt, bool) {
		for k := p[0]; k < p[1]; k++ {
			var err error
			if ops[k], err = decodeMessage(h, msgs[pending[k]], buf); err != nil {
				return nil, false
			}
		}
		stmts, err := h.plan(ops[p[0]:p[1]])
		return stmts, err == nil
	}
	data, ok := plan(pieces[0])
	if !ok {
		return nil, streamRegular, nil
	}
	stmts := append(head, data...)
	for i := range pieces {
		last := i == len(pieces)-1
		var next []stmt
		nextOK := true
		meanwhile := func() { next, nextOK = plan(pieces[i+1]) }
		if last {
			if adv, ok := a.progress.advanceStmt(st.advanced); ok {
				stmts = append(stmts, adv)
			}
			stmts, meanwhile = append(stmts, stmt{sql: "COMMIT"}), nil
		}
		if at, err := sendAtMeanwhile(ctx, conn, stmts, meanwhile); err != nil {
			if i == 0 && at == guard && isGuardMoved(err) {
				return rollback(ctx, conn, streamMoved)
			}
			return nil, streamDone, err
		}
		if !nextOK {
			return rollback(ctx, conn, streamRegular)
		}
		stmts = next
	}
	a.progress.markKnown(shards)
	st.res.count()
	return st.res, streamDone, nil
}

// piecewiseMode reports whether h's batches may go in pieces: upsert and cdc, whose plans apply
// ops in offset order with nothing that depends on the batch as a whole (append has its streamed
// COPY; sql mode runs the user's statements, which may read what the batch wrote).
func piecewiseMode(h modeHandler) bool {
	switch h.(type) {
	case upsertMode, cdcMode:
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
