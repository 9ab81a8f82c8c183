package tests

import (
	"strings"
	"testing"
	"time"

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
// Until pg_cdc waits for the transaction to become visible before it trusts an empty read-back
// (internal/source/session.go readback), this test fails: the `c` event keeps "unchanged":["body"]
// with no later event, and B's row has a NULL body.
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
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(rt.ctx, `UPDATE rt SET id = 2 WHERE id = 1`) // waits for the standby
		done <- err
	}()
	// let pg_cdc decode the flushed commit and write its events while the commit is not visible
	sinkWaitUntil(t, 30*time.Second, "the key change in the queue", func() (bool, string) {
		entries, err := oracle.ReadQueue(rt.ctx, rt.rd.Client(), "pgrelay", "q")
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if strings.HasPrefix(string(e.Payload), `{"op":"c"`) && strings.Contains(string(e.Payload), `"key":{"id":2}`) {
				t.Logf("queue: %s", clip(string(e.Payload)))
				return true, ""
			}
		}
		return false, "not yet"
	})
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
