package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
)

// TestSnapshotNextTableSeesHeldCommit: a commit on table b that a synchronous standby holds (its
// record decoded and its `u` in the queue, still invisible to new snapshots) is decoded while the
// snapshot reads table a. When the snapshot moves on to b, b's first chunk must not put the row's
// old state in the queue after that `u`: the consumer's last event for the key must be the new row.
func TestSnapshotNextTableSeesHeldCommit(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 300) i;
		CREATE TABLE b (id int PRIMARY KEY, v text);
		INSERT INTO b VALUES (1, 'old')`)
	stop := e.run("held", `[{table: a, queue: q}, {table: b, queue: q}]`, "snapshot: initial\nchunk_rows: 10")
	defer stop()
	ctx := e.ctx
	cdctest.Wait(t, 60*time.Second, "a chunk of a written", func() (bool, string) { return e.cursorAfter("held", "q") > 0, "" })
	// Hold the snapshot on a: a chunk's read waits for this lock.
	lock, err := e.pg.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	// (ACCESS EXCLUSIVE takes an xid: committed with synchronous_commit local, not held)
	if _, err := lock.Exec(ctx, `SET LOCAL synchronous_commit = local; LOCK TABLE a IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cdctest.Wait(t, 30*time.Second, "a chunk's read of a waiting for the lock", func() (bool, string) {
		var n int
		err := e.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT %FROM "public"."a"%'`).Scan(&n)
		return err == nil && n > 0, fmt.Sprint(err)
	})
	e.pg.HoldCommits()
	committed := make(chan error, 1)
	go func() {
		tx, err := e.pg.Pool().Begin(context.Background())
		if err != nil {
			committed <- err
			return
		}
		if _, err := tx.Exec(context.Background(), `UPDATE b SET v = 'new' WHERE id = 1`); err != nil {
			committed <- err
			return
		}
		committed <- tx.Commit(context.Background()) // held by the standby that never answers
	}()
	cdctest.Wait(t, 30*time.Second, "the held update of b in the queue", func() (bool, string) {
		entries, err := oracle.ReadQueue(ctx, e.rd.Client(), "pgrelay", "q")
		if err != nil {
			return false, err.Error()
		}
		for _, en := range entries {
			var ev struct {
				Op    string `json:"op"`
				Table string `json:"table"`
			}
			_ = json.Unmarshal(en.Payload, &ev)
			if ev.Op == "u" && strings.HasSuffix(ev.Table, "b") {
				return true, ""
			}
		}
		return false, ""
	})
	var visible int
	if err := e.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM b WHERE v = 'new'`).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("setup: the held update is visible (%d, %v)", visible, err)
	}
	if err := lock.Commit(ctx); err != nil { // the snapshot goes on: the rest of a, then b
		t.Fatal(err)
	}
	// Give the snapshot time to read b while the commit is still held.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if cur, _ := e.snapshotCursor("held", "q"); cur == "null" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.pg.ReleaseCommits()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	e.waitSnapshotDone("held", "q", 60*time.Second)
	e.waitOracle("q", 10*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
}
