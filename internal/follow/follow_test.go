package follow

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func connect(t *testing.T, pg *testenv.Postgres) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// heldWriter commits an update of the balance through its own connection while commits are held,
// and returns its xid and a channel closed when the commit returns.
func heldWriter(t *testing.T, pg *testenv.Postgres, sql string) (xid uint64, done chan struct{}) {
	t.Helper()
	ctx := context.Background()
	w := connect(t, pg)
	var pid int
	if err := w.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		if _, err := w.Exec(ctx, sql); err != nil {
			t.Errorf("held writer: %v", err)
		}
	}()
	var x string
	cdctest.WaitEvery(t, 30*time.Second, 10*time.Millisecond, "the writer's commit to wait for the standby", func() (bool, string) {
		var ev string
		_ = pg.Pool().QueryRow(ctx, `SELECT coalesce(wait_event, ''), coalesce(backend_xid::text, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev, &x)
		return ev == "SyncRep", "wait event " + ev
	})
	n, err := strconv.ParseUint(x, 10, 32)
	if err != nil {
		t.Fatalf("held writer's xid %q: %v", x, err)
	}
	return n, done
}

func balance(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	t.Helper()
	var b int64
	if err := q.QueryRow(context.Background(), `SELECT balance FROM accounts WHERE id = 1`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWaitCommittedWaitsForHeldCommits: a commit a synchronous standby holds (its record flushed,
// so pg_cdc would have it in the queue) is invisible to new snapshots, and its xid is at or above
// their xmax, so pg_snapshot_xip does not list it: waiting for the xids in progress that a
// snapshot lists would return at once and the load would miss the transaction. WaitCommitted
// waits for it until it is released, and a load begun after sees it: its snapshot sees the xid,
// and the commit is below the load's insert position.
func TestWaitCommittedWaitsForHeldCommits(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)`)
	pg.Exec(`INSERT INTO accounts VALUES (1, 0)`)
	pg.HoldCommits()
	xid, done := heldWriter(t, pg, `UPDATE accounts SET balance = balance + 5 WHERE id = 1`)
	var commitLSN string
	if err := pg.Pool().QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&commitLSN); err != nil {
		t.Fatal(err)
	}

	// the window: the commit record is flushed, yet a load now would not see it
	reader := connect(t, pg)
	tx, snap, lsn, err := Begin(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	if b := balance(t, tx); b != 0 {
		t.Fatalf("a held commit is visible: balance %d", b)
	}
	_ = tx.Rollback(ctx)
	s, err := queue.ParseStart("0-0", snap, lsn)
	if err != nil {
		t.Fatal(err)
	}
	if s.Snapshot.Sees(uint32(xid)) {
		t.Fatalf("snapshot %s sees the held xid %d", snap, xid)
	}
	for _, x := range s.Snapshot.Xip {
		if x == xid {
			t.Fatalf("snapshot %s lists the held xid %d in progress: the case where waiting for the listed xids would do is not the one tested", snap, xid)
		}
	}

	waited := make(chan error, 1)
	var told []string
	go func() {
		c, err := pgconn.Connect(ctx, pg.DSN())
		if err != nil {
			waited <- err
			return
		}
		defer c.Close(ctx)
		waited <- WaitCommitted(ctx, c, func(xids []string) { told = xids })
	}()
	select {
	case err := <-waited:
		t.Fatalf("WaitCommitted returned while a commit is held: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	pg.ReleaseCommits()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitCommitted did not return once the commit was released")
	}
	<-done
	t.Logf("held xid %d (snapshot during the hold %s); WaitCommitted was told of %v", xid, snap, told)

	tx, snap, lsn, err = Begin(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if b := balance(t, tx); b != 5 {
		t.Fatalf("the load after the wait reads balance %d, want 5", b)
	}
	if s, err = queue.ParseStart("0-0", snap, lsn); err != nil {
		t.Fatal(err)
	}
	flushed, _ := pglogrepl.ParseLSN(commitLSN)
	if !s.Snapshot.Sees(uint32(xid)) || s.LSN < flushed {
		t.Fatalf("the load's snapshot %s / lsn %s does not have the transaction (xid %d, flushed by %s)", snap, lsn, xid, commitLSN)
	}
}

// TestWaitCommittedWaitsForOpenWriteTransactions: WaitCommitted waits for a transaction that had
// an xid when it was called (it may commit any moment), and not for a read-only one.
func TestWaitCommittedWaitsForOpenWriteTransactions(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)`)
	pg.Exec(`INSERT INTO accounts VALUES (1, 0)`)
	ro, err := connect(t, pg).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Rollback(ctx)
	_ = balance(t, ro) // a snapshot, no xid
	c, err := pgconn.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = WaitCommitted(wctx, c, nil)
	cancel()
	if err != nil {
		t.Fatalf("an open read-only transaction held WaitCommitted: %v", err)
	}

	rw, err := connect(t, pg).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- WaitCommitted(ctx, c, nil) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitCommitted returned while a write transaction is open: %v", err)
	case <-time.After(time.Second):
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("WaitCommitted did not return once the transaction committed")
	}
}
