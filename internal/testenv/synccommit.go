package testenv

import (
	"context"
	"time"
)

// HoldCommits makes the server wait at every commit for a synchronous standby that never answers
// (synchronous_standby_names = 'nobody'): a transaction that wrote something has its commit record
// written and flushed, so a walsender decodes it, but stays in progress for every other session
// (pg_xact_status says so, snapshots do not see it) until ReleaseCommits. Sessions with
// synchronous_commit = local or off are not held, nor transactions without an xid. It returns once
// a probe commit (a transactional logical message with the prefix testenv_probe, which nothing
// decodes into a change) was seen waiting, so every commit from then on is held; the probe itself
// is cancelled and commits. The test's cleanup releases the commits if the test did not.
func (pg *Postgres) HoldCommits() {
	pg.t.Helper()
	pg.Exec(`ALTER SYSTEM SET synchronous_standby_names = 'nobody'`)
	pg.Exec(`SELECT pg_reload_conf()`)
	pg.t.Cleanup(pg.ReleaseCommits)
	// pg_reload_conf only signals the postmaster: wait until a commit waits for the standby.
	deadline := time.Now().Add(30 * time.Second)
	for !pg.probeHeld() {
		if time.Now().After(deadline) {
			pg.t.Fatal("testenv: commits do not wait for the synchronous standby 'nobody'")
		}
	}
}

// ReleaseCommits lets the held commits and every later one finish (synchronous_standby_names
// reset and reloaded: the waiting backends are released and leave the proc array, so their
// transactions become visible).
func (pg *Postgres) ReleaseCommits() {
	pg.Exec(`ALTER SYSTEM RESET synchronous_standby_names`)
	pg.Exec(`SELECT pg_reload_conf()`)
}

// probeHeld commits a probe transaction and reports whether its commit waited for the standby
// (pg_stat_activity's wait_event SyncRep) within a second; the probe is then cancelled.
func (pg *Postgres) probeHeld() bool {
	ctx := context.Background()
	conn, err := pg.Pool().Acquire(ctx)
	if err != nil {
		pg.t.Fatalf("testenv: probe: %v", err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		pg.t.Fatalf("testenv: probe: %v", err)
	}
	finished := make(chan struct{})
	go func() {
		_, _ = conn.Exec(ctx, `SELECT pg_logical_emit_message(true, 'testenv_probe', '')`)
		close(finished)
	}()
	held := false
	for i := 0; i < 50 && !held; i++ {
		var ev string
		_ = pg.Pool().QueryRow(ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev)
		held = ev == "SyncRep"
		if held {
			break
		}
		select {
		case <-finished:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	for {
		_, _ = pg.Pool().Exec(ctx, `SELECT pg_cancel_backend($1)`, pid)
		select {
		case <-finished:
			return held
		case <-time.After(100 * time.Millisecond):
		}
	}
}
