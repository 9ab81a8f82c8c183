package source

import (
	"context"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSnapshotWaitsForHeldCommitAboveXmax: the wait before a snapshot's first chunk (and, after a
// restart, before the chunk that resumes it) must not end while a transaction whose commit a
// synchronous standby holds is still invisible, also when its xid is at or above the snapshot's
// xmax (the newest transaction, nothing newer ended), which pg_snapshot_xip does not list: its
// change may already be in the queue (decoded, delivered before the restart), and a chunk read now
// would put the row's old state after it.
func TestSnapshotWaitsForHeldCommitAboveXmax(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE held (id int PRIMARY KEY, v text); INSERT INTO held VALUES (1, 'old')`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg.HoldCommits()
	conn, err := pg.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint32
	if err := tx.QueryRow(ctx, `SELECT (pg_current_xact_id()::text::bigint % 4294967296)::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE held SET v = 'new' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx) }()
	waitHeld(t, ctx, pg, xid)
	sn := &snapshotter{pool: pg.Pool(), ss: &session{src: &Source{}}}
	done := make(chan error, 1)
	go func() { done <- sn.waitEarlierTransactions(ctx) }()
	select {
	case err := <-done:
		var v string
		_ = pg.Pool().QueryRow(ctx, `SELECT v FROM held WHERE id = 1`).Scan(&v)
		pg.ReleaseCommits()
		<-committed
		t.Fatalf("the wait ended (%v) while the held commit is invisible (a chunk now reads v = %q)", err, v)
	case <-time.After(2 * time.Second):
	}
	pg.ReleaseCommits()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not end after the release")
	}
}
