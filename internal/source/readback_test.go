package source

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestWaitVisibleOfAHeldCommit proves that read-back waits for a transaction whose commit a
// synchronous standby holds (decoded, still in progress for every other session), even when its
// xid is at or above the current snapshot's xmax, and returns once the commit is released.
func TestWaitVisibleOfAHeldCommit(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE held (id int PRIMARY KEY)`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg.HoldCommits()
	// Two held commits: the newer one's xid is above the snapshot's xmax (the older one is not
	// completed either), the case a 32-bit xid must not be widened into the epoch before.
	var xid uint32
	committed := make(chan error, 2)
	for i := 1; i <= 2; i++ {
		conn, err := pg.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT (pg_current_xact_id()::text::bigint % 4294967296)::bigint`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO held VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
		go func() { committed <- tx.Commit(ctx) }() // held by the standby that never answers
		waitHeld(t, ctx, pg, xid)
	}

	other, err := pg.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	// The held transaction is the newest: the snapshot's xmax is at or below its xid.
	var xmax int64
	if err := other.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	if int64(xid) <= xmax%4294967296 {
		t.Fatalf("setup: xid %d not above xmax %d", xid, xmax)
	}
	t.Logf("held xid %d, snapshot xmax %d", xid, xmax)
	visible := make(chan error, 1)
	go func() { visible <- waitVisible(ctx, other.Conn().PgConn(), xid) }()
	select {
	case err := <-visible:
		t.Fatalf("waitVisible returned while the commit is held: %v", err)
	case <-time.After(time.Second):
	}
	pg.ReleaseCommits()
	if err := <-visible; err != nil {
		t.Fatalf("waitVisible after the release: %v", err)
	}
	for range 2 {
		if err := <-committed; err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM held`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("after waitVisible the row is visible: n=%d err=%v", n, err)
	}
}

// waitHeld waits until the backend of transaction xid waits for the synchronous standby.
func waitHeld(t *testing.T, ctx context.Context, pg *testenv.Postgres, xid uint32) {
	t.Helper()
	for {
		var n int
		if err := pg.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND backend_xid::text = $1`, fmt.Sprint(xid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("transaction %d never waited for the standby", xid)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
