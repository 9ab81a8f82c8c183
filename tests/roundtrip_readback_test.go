package tests

import (
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
)

// TestRoundTripKeyChangeOfACommitNotYetVisible reproduces, deterministically, the race that
// TestRoundTripAToQueueToB meets now and then: PostgreSQL writes and flushes a commit record (so
// a walsender can decode it) before the committing backend leaves the proc array, i.e. before
// other sessions can see its rows. A synchronous standby that never answers holds a commit in that
// state for as long as we like. A key change of a row whose TOASTed body is unchanged is decoded
// then; pg_cdc must read the body back by the new key, and the copy in B must end up equal to A
// once the commit becomes visible.
//
// pg_cdc waits for the transaction to become visible before it trusts an empty read-back
// (internal/source/session.go readback); without that the `c` event keeps "unchanged":["body"] with
// no later event, and B's row has a NULL body.
func TestRoundTripKeyChangeOfACommitNotYetVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	rt := newRoundTrip(t, "invisible")
	dsnB := rt.database("b")
	// the sink's database commits locally whatever synchronous_standby_names says
	rt.pg.Exec(`ALTER DATABASE b SET synchronous_commit = local`)
	p := startSinkPipeline(t, rt.sinkConfig(dsnB, "copy_b", "copy_b"))

	rt.pg.Exec(`INSERT INTO rt (id, doc, amount, big, tags, body) VALUES (1, '{"a": 1}', 1, 1, '{x}', repeat('toast ', 5000))`)
	rt.waitCaughtUp("b", "copy_b", p, 60*time.Second)

	rt.pg.Exec(`CREATE TABLE sync_probe (x int)`) // not published: only commits through it
	rt.pg.Exec(`ALTER SYSTEM SET synchronous_standby_names = 'nobody'`)
	rt.pg.Exec(`SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		rt.pg.Exec(`ALTER SYSTEM RESET synchronous_standby_names`)
		rt.pg.Exec(`SELECT pg_reload_conf()`)
	})
	conn, err := rt.pg.Pool().Acquire(rt.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(rt.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// pg_reload_conf is asynchronous (the checkpointer turns synchronous waits on): commit probes
	// until one waits for the standby, so the writer's commit surely will.
	cdctest.WaitEvery(t, 20*time.Second, 250*time.Millisecond, "commits waiting for the standby", func() (bool, string) {
		probe, err := rt.pg.Pool().Acquire(rt.ctx)
		if err != nil {
			return false, err.Error()
		}
		defer probe.Release()
		var probePid int
		probe.QueryRow(rt.ctx, `SELECT pg_backend_pid()`).Scan(&probePid)
		finished := make(chan struct{})
		go func() { probe.Exec(rt.ctx, `INSERT INTO sync_probe VALUES (1)`); close(finished) }()
		defer func() { rt.pg.Exec(`SELECT pg_cancel_backend($1)`, probePid); <-finished }()
		for i := 0; i < 20; i++ {
			var ev string
			rt.pg.Pool().QueryRow(rt.ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, probePid).Scan(&ev)
			if ev == "SyncRep" {
				return true, ""
			}
			select {
			case <-finished:
				return false, "a probe commit did not wait"
			case <-time.After(50 * time.Millisecond):
			}
		}
		return false, "probe not seen waiting"
	})
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(rt.ctx, `UPDATE rt SET id = 2 WHERE id = 1`) // waits for the standby
		done <- err
	}()
	// pg_cdc decodes the flushed commit, finds no row by the new key and must wait for the commit
	// to become visible (it polls pg_xact_status) instead of sending a `c` with "unchanged".
	cdctest.WaitEvery(t, 30*time.Second, 250*time.Millisecond, "pg_cdc waiting for the commit to become visible", func() (bool, string) {
		var n int
		if err := rt.pg.Pool().QueryRow(rt.ctx, `SELECT count(*) FROM pg_stat_activity
		    WHERE query LIKE '%pg_xact_status%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			return false, err.Error()
		}
		if n > 0 {
			return true, ""
		}
		return false, "not yet"
	})
	entries, err := oracle.ReadQueue(rt.ctx, rt.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(string(e.Payload), `"key":{"id":2}`) {
			t.Fatalf("the key change reached the queue before its commit was visible: %s", clip(string(e.Payload)))
		}
	}
	rt.pg.Exec(`SELECT pg_cancel_backend($1)`, pid) // the commit stands locally and becomes visible
	select {
	case err := <-done:
		t.Logf("the writer's wait for the standby ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the writer never came back")
	}
	var visible int
	if err := rt.pg.Pool().QueryRow(rt.ctx, `SELECT count(*) FROM rt WHERE id = 2 AND length(body) = 30000`).Scan(&visible); err != nil || visible != 1 {
		t.Fatalf("the key change is not committed in A: %v", err)
	}
	rt.waitCaughtUp("b", "copy_b", p, 20*time.Second)
}
