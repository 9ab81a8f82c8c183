package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// TestSnapshotNextTableSeesHeldCommit: a commit on table b that a synchronous standby holds (its
// record decoded and its `u` in the queue, still invisible to new snapshots) is decoded while the
// snapshot reads table a. When the snapshot moves on to b, b's first chunk must not put the row's
// old state in the queue after that `u`: the consumer's last event for the key must be the new row.
func TestSnapshotNextTableSeesHeldCommit(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 3000) i;
		CREATE TABLE b (id int PRIMARY KEY, v text);
		INSERT INTO b VALUES (1, 'old')`)
	stop := e.run("held", `[{table: a, queue: q}, {table: b, queue: q}]`, "snapshot: initial\nchunk_rows: 10")
	defer stop()
	ctx := e.ctx
	release := e.holdChunkReads("held", "q", "a")
	defer release()
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
	release() // the snapshot goes on: the rest of a, then b
	// Give the snapshot time to read b while the commit is still held: once all of a is in the
	// queue, b's one chunk would follow within milliseconds if it did not wait for the commit.
	var doneWithA time.Time
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cur, _ := e.snapshotCursor("held", "q")
		if cur == "null" {
			break
		}
		var c snapshot.Cursor
		_ = json.Unmarshal([]byte(cur), &c)
		if c.Table == "public.b" || (c.Table == "public.a" && c.Rows >= 3000) {
			if doneWithA.IsZero() {
				doneWithA = time.Now()
			} else if time.Since(doneWithA) > time.Second {
				break
			}
		}
	}
	e.pg.ReleaseCommits()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	e.waitSnapshotDone("held", "q", 60*time.Second)
	e.waitOracle("q", 10*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
}

// TestSnapshotTableSwitchIgnoresOpenTransactions: moving on to the next table waits for the commits
// the stream has decoded only, not for write transactions still open: a transaction left open for
// long (a batch job, a session idle in a transaction) must not stop the snapshot at every table.
func TestSnapshotTableSwitchIgnoresOpenTransactions(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 3000) i;
		CREATE TABLE b (id int PRIMARY KEY, v text);
		INSERT INTO b SELECT i, md5(i::text) FROM generate_series(1, 50) i;
		CREATE TABLE unrelated (id int)`)
	stop := e.run("open", `[{table: a, queue: q}, {table: b, queue: q}]`, "snapshot: initial\nchunk_rows: 10")
	defer stop()
	release := e.holdChunkReads("open", "q", "a")
	defer release()
	open, err := e.pg.Pool().Begin(e.ctx) // a write transaction (it has an xid) begun after the snapshot's start
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(e.ctx)
	if _, err := open.Exec(e.ctx, `INSERT INTO unrelated VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	release()
	e.waitSnapshotDone("open", "q", 30*time.Second)
	if err := open.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.waitOracle("q", 10*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
}

// chunkReadsWaiting counts the snapshot's chunk reads of table $1 (quoted and schema-qualified, as
// the chunk query names it) waiting for a lock. The chunk query orders by the key and has a limit;
// the stream's read-back of an unchanged value after a key change (SELECT ... WHERE id = $1) also
// waits for a table lock, outside any chunk window, and must not be taken for a chunk's read.
const chunkReadsWaiting = `SELECT count(*) FROM pg_stat_activity
	WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT %FROM ' || $1 || '% ORDER BY % LIMIT %'`

// lockChunkReads takes an ACCESS EXCLUSIVE lock on table (of schema public) in a transaction it
// returns once a snapshot chunk's read of table waits for it.
func (e *env) lockChunkReads(table string) pgx.Tx {
	t, ctx := e.t, e.ctx
	t.Helper()
	lock, err := e.pg.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// (ACCESS EXCLUSIVE takes an xid: committed with synchronous_commit local, never held)
	// a failure below must not leave the lock's connection out of the pool (its Close waits for it)
	t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, `SET LOCAL synchronous_commit = local; LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cdctest.Wait(t, 30*time.Second, "a chunk's read of "+table+" waiting for the lock", func() (bool, string) {
		var n int
		err := e.pg.Pool().QueryRow(ctx, chunkReadsWaiting, `"public"."`+table+`"`).Scan(&n)
		return err == nil && n > 0, fmt.Sprint(err)
	})
	return lock
}

// holdChunkReads waits until a chunk of table is in the queue, then holds the snapshot's reads of
// table (an ACCESS EXCLUSIVE lock, which the next chunk's read waits for) and returns once a read
// waits. release (safe to call twice) lets the reads go on. The table must have many more chunks
// than the snapshot reads ahead of the output (chunksAhead), or it may be read to its end before the
// lock is taken.
func (e *env) holdChunkReads(name, queue, table string) (release func()) {
	t, ctx := e.t, e.ctx
	cdctest.Wait(t, 60*time.Second, "a chunk of "+table+" written", func() (bool, string) { return e.cursorAfter(name, queue) > 0, "" })
	lock := e.lockChunkReads(table)
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := lock.Commit(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}
