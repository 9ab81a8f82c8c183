// Package follow is the PostgreSQL side of loading a state and then following a queue from where the
// load ends, exactly (docs/queue.md "Load, then follow"; the queue side is queue.Start):
//
//  1. read the queue's positions (queue.ReadPositions, `pgrelay queue position`);
//  2. WaitCommitted: wait until every transaction that may have committed by then is visible;
//  3. Begin: a REPEATABLE READ transaction whose first statement reads its snapshot and the WAL
//     insert position; load the state in it;
//  4. start a new consumer group with the positions, the snapshot and the lsn (queue.Start).
//
// Step 2 is needed because PostgreSQL writes and flushes a transaction's commit record (so a
// walsender decodes it and pg_cdc puts it in the queue) before the committing backend leaves the
// proc array, and only then do new snapshots see it. A synchronous standby that has not answered
// keeps a commit in that state for as long as it stays silent. Such a transaction can be at or
// before the positions and still invisible to the load's snapshot: without the wait it would be
// neither in the load nor delivered.
package follow

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// nextXidSQL assigns the session's transaction an xid: every transaction that had one before
// (every transaction that can have committed by now) has a smaller one. The caller rolls it back,
// so it commits nothing and never waits for a synchronous standby.
const nextXidSQL = `SELECT pg_catalog.pg_current_xact_id()::text`

// waitSQL reports whether no transaction with an xid below $1 is still in progress, and lists (up
// to 20) of those that are. A snapshot's xmin is its oldest xid in progress, or its xmax when none
// is; xmin >= $1 therefore means every xid below $1 has ended (one at or above xmax would make
// xmax > $1 and then be in xip, below xmin: impossible). pg_snapshot_xip alone is not enough: it
// lists only xids below xmax, and a commit held back by a synchronous standby can be at or above
// xmax when nothing newer has ended.
const waitSQL = `SELECT pg_catalog.pg_snapshot_xmin(s) >= $1::xid8,
	coalesce((SELECT string_agg(x::text, ',') FROM (SELECT x FROM pg_catalog.pg_snapshot_xip(s) x
		WHERE x < $1::xid8 ORDER BY x LIMIT 20) y), '')
FROM (SELECT pg_catalog.pg_current_snapshot() AS s) z`

// WaitCommitted waits until every transaction that may have committed before the call (its commit
// record written, so pg_cdc may have put it in the queue) has ended, so that a snapshot taken
// after it returns sees all of them. It takes a new xid in a transaction it rolls back, then waits
// until no transaction with a smaller xid is in progress: the same wait as CREATE INDEX
// CONCURRENTLY's, for the write transactions open at the call (read-only ones have no xid). It
// polls every 20 ms to 200 ms; waiting, when not nil, is told the xids still in progress (at most
// 20) once a second. conn must not be inside a transaction. Run it on the primary the queue's
// source reads (a standby cannot assign an xid).
func WaitCommitted(ctx context.Context, conn *pgconn.PgConn, waiting func(xids []string)) error {
	res := conn.Exec(ctx, "BEGIN; "+nextXidSQL+"; ROLLBACK")
	results, err := res.ReadAll()
	if err != nil {
		return fmt.Errorf("take an xid: %w", err)
	}
	if len(results) != 3 || len(results[1].Rows) != 1 {
		return fmt.Errorf("take an xid: unexpected reply")
	}
	next := string(results[1].Rows[0][0])
	if _, err := strconv.ParseUint(next, 10, 64); err != nil {
		return fmt.Errorf("take an xid: %q: %w", next, err)
	}
	param := [][]byte{[]byte(next)}
	told := time.Now()
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		r := conn.ExecParams(ctx, waitSQL, param, nil, nil, nil).Read()
		if r.Err != nil {
			return fmt.Errorf("wait for the transactions in progress: %w", r.Err)
		}
		if len(r.Rows) != 1 {
			return fmt.Errorf("wait for the transactions in progress: unexpected reply")
		}
		if string(r.Rows[0][0]) == "t" {
			return nil
		}
		if waiting != nil && time.Since(told) >= time.Second {
			told = time.Now()
			var xids []string
			if s := string(r.Rows[0][1]); s != "" {
				xids = strings.Split(s, ",")
			}
			waiting(xids)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// beginSQL is the load transaction's first statement: it takes the transaction's snapshot, so
// pg_current_snapshot() is the snapshot every later statement of the load reads with, and the
// insert position is read after it was taken.
const beginSQL = `SELECT pg_catalog.pg_current_snapshot()::text, pg_catalog.pg_current_wal_insert_lsn()::text`

// Begin starts the load's transaction: REPEATABLE READ, read only, with the snapshot and the WAL
// insert position read by its first statement. Load the state through tx, then commit it and
// start the group with queue.ParseStart(positions, snapshot, lsn). The insert position, not
// pg_current_wal_lsn() (the write position): a transaction committed with synchronous_commit =
// off is visible before its commit record is written.
func Begin(ctx context.Context, conn *pgx.Conn) (tx pgx.Tx, snapshot, lsn string, err error) {
	tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, "", "", fmt.Errorf("begin the load: %w", err)
	}
	if err := tx.QueryRow(ctx, beginSQL).Scan(&snapshot, &lsn); err != nil {
		_ = tx.Rollback(ctx)
		return nil, "", "", fmt.Errorf("begin the load: read its snapshot: %w", err)
	}
	return tx, snapshot, lsn, nil
}
