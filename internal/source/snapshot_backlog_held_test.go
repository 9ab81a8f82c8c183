package source_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// TestSnapshotAheadOfTheBacklogHeldCommits: chunks that go into the queue ahead of a backlog, read
// while a synchronous standby holds commits that change their rows. Such a commit is in the WAL, and
// may already be in the queue, while the chunk's read does not see it: the rows it changed keep
// their old, long-committed versions, so the chunk may go early. Behind the backlog (b's changes,
// committed with synchronous_commit = local so they are not held) lie, in this order, the held
// commit T2 on ids 21–80 of the added table a, more backlog, and the held commit T3 on ids
// 121–180 (updates, deletes, and inserts past a's end), then the rest of the backlog. The
// snapshot of a starts while a transaction begun before it is open, and waits for it; that
// transaction commits once the stream has put T2 in the queue, far ahead of T3, and a's chunks
// are read while both commits are still held:
//   - the chunks of T2's rows go after T2's events: the rows T2 changed must be dropped, or their
//     old values would follow T2's events;
//   - the chunks of T3's rows go before T3's events: the old values are right there, and T3's
//     events must follow them with a higher lsn (the `r` events must not carry a position of the
//     WAL past T3's commit).
//
// Both commits are released once the snapshot is done: it must end while they are held (before
// PostgreSQL 17 every high watermark is flushed by an empty commit, which must not wait for the
// standby). The queue replays exactly to both tables
// (the replay also requires lsns never to decrease in a partition), a's rows were in the queue
// while the stream was still short of T3, and each key shows the order above.
func TestSnapshotAheadOfTheBacklogHeldCommits(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx
	writeBacklog(e, "held")

	// A transaction open across the start (it has an xid): the snapshot's first chunk waits for it.
	open, err := e.pg.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.Background())
	if _, err := open.Exec(ctx, `DELETE FROM a WHERE id IN (10, 100, 190)`); err != nil {
		t.Fatal(err)
	}
	stop := e.run("held", `[{table: b, queue: q}, {table: a, queue: q}]`, backlogExtra)
	defer stop()
	cdctest.Wait(t, 30*time.Second, "the snapshot waiting for the open transaction", func() (bool, string) {
		var n int
		err := e.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE '%pg_snapshot_xmin(s) >=%' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0, ""
	})

	e.pg.HoldCommits()
	t2 := e.commitHeld(`UPDATE a SET v = 'held 2' WHERE id BETWEEN 21 AND 80 AND id % 3 = 0;
		DELETE FROM a WHERE id BETWEEN 21 AND 80 AND id % 3 = 1`)
	afterT2 := cdctest.CurrentLSN(t, e.pg.Pool())
	// room for a's chunks to go ahead before the stream reaches T3: 150,000 rows in batches of
	// 100, seconds of the stream's work (50,000 were passed in a CI run before the chunks began)
	e.writeLocal(100, 300)
	beforeT3 := cdctest.CurrentLSN(t, e.pg.Pool())
	t3 := e.commitHeld(`UPDATE a SET v = 'held 3' WHERE id BETWEEN 121 AND 180 AND id % 3 = 0;
		DELETE FROM a WHERE id BETWEEN 121 AND 180 AND id % 3 = 1;
		INSERT INTO a SELECT i, 'held 3' FROM generate_series(201, 210) i`)
	e.writeLocal(400, 10)

	// The highest key of a the snapshot had in the queue while the stream was short of T3.
	var ahead int
	watched := watchBelow(e, "pgrelay:{q}:src:held:ptr", beforeT3, func(p *pointer.Pointer, _ time.Time) {
		var cur struct {
			Table string   `json:"table"`
			After []string `json:"after"`
		}
		if json.Unmarshal(p.Snapshot, &cur) == nil && cur.Table == "public.a" && len(cur.After) == 1 {
			n, _ := strconv.Atoi(cur.After[0])
			ahead = max(ahead, n)
		}
	})
	rdb := e.rd.Client()
	cdctest.Wait(t, 30*time.Second, "T2 in the queue", func() (bool, string) {
		p := cdctest.ReadPointer(t, rdb, "q", "held")
		if p == nil {
			return false, "no pointer"
		}
		return p.LSNValue() >= afterT2, "pointer at " + p.LSNValue().String()
	})
	var visible int
	if err := e.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM a WHERE v LIKE 'held%'`).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("setup: the held commits are visible (%d rows, %v)", visible, err)
	}
	if _, err := open.Exec(ctx, `SET LOCAL synchronous_commit = local`); err != nil {
		t.Fatal(err)
	}
	// Redis takes no writes for a second from here: the stream, its item queue full, stays short of
	// T3 while the snapshot notices the commit below (it polls every 20-200 ms) and reads its first
	// chunks, which are then far ahead of the stream whatever the machine's speed.
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", "1000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The snapshot ends with the commits still held (before PostgreSQL 17 each high watermark is
	// flushed by a commit of its own, which is local: it does not wait for the standby).
	e.waitTables("held", "q", "public.b", "public.a")
	watched()
	e.pg.ReleaseCommits()
	for _, c := range []<-chan error{t2, t3} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	end := cdctest.CurrentLSN(t, e.pg.Pool())
	cdctest.WaitCovered(t, 30*time.Second, 20*time.Millisecond, end, func() *pointer.Pointer {
		return cdctest.ReadPointer(t, rdb, "q", "held")
	})
	e.waitOracle("q", 20*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})
	if ahead <= 80 { // under the high-watermark rule, none: every chunk's watermarks follow the backlog
		t.Errorf("a's snapshot was in the queue up to id %d only while the stream was short of T3", ahead)
	}

	// Per key of a, its events in queue order.
	entries, err := oracle.ReadQueue(ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		op  string
		lsn pglogrepl.LSN
	}
	keys := map[int][]ev{}
	for _, en := range entries {
		if !bytes.Contains(en.Payload, []byte(`"table":"public.a"`)) { // b's backlog, the bulk
			continue
		}
		var got struct {
			Op    string `json:"op"`
			Table string `json:"table"`
			Key   struct {
				ID int `json:"id"`
			} `json:"key"`
			LSN string `json:"lsn"`
		}
		if err := json.Unmarshal(en.Payload, &got); err != nil {
			t.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(got.LSN)
		if err != nil {
			t.Fatalf("entry %s: lsn %q: %v", en.ID, got.LSN, err)
		}
		keys[got.Key.ID] = append(keys[got.Key.ID], ev{got.Op, lsn})
	}
	// Each key's events in queue order, as a string of ops: a key of T2's, whose chunk went after
	// T2's events, has T2's event only (its row dropped from the chunk); a key of T3's has the
	// chunk's old row and then T3's event, at a higher lsn, when its chunk went before T3's events
	// (as it should: the stream was far from T3), else T3's event only; every other key read by
	// the snapshot its r alone, and T3's inserts their c.
	var t2Keys, t3Ahead int
	for id := 1; id <= 210; id++ {
		ops := ""
		for _, x := range keys[id] {
			ops += x.op
		}
		t2, t3 := id >= 21 && id <= 80 && id%3 != 2, id >= 121 && id <= 180 && id%3 != 2
		step := map[int]string{0: "u", 1: "d"}[id%3]
		want := "r"
		switch {
		case id == 10 || id == 100 || id == 190: // the open transaction's deletes, seen by every read
			continue
		case id > 200:
			want = "c"
		case t2:
			t2Keys++
			want = step
		case t3 && ops == "r"+step:
			t3Ahead++
			want = ops
			if keys[id][0].lsn > keys[id][1].lsn {
				t.Errorf("id %d: the chunk's r at %s, then T3's %s at %s", id, keys[id][0].lsn, step, keys[id][1].lsn)
			}
		case t3:
			want = step
		}
		if ops != want {
			t.Errorf("id %d: events %q, want %q", id, ops, want)
		}
	}
	if t3Ahead == 0 {
		t.Errorf("no chunk of T3's rows went into the queue before T3's events")
	}
	t.Logf("a in the queue up to id %d while the stream was short of T3; %d keys of T2 dropped from their chunks, %d keys of T3 in the queue before T3",
		ahead, t2Keys, t3Ahead)
}

// commitHeld runs sql in a transaction and commits it in a goroutine while commits are held
// (HoldCommits); it returns once the commit waits for the standby, with the commit's result to come.
func (e *env) commitHeld(sql string) <-chan error {
	e.t.Helper()
	ctx := context.Background()
	conn, err := e.pg.Pool().Acquire(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		conn.Release()
		e.t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		defer conn.Release()
		committed <- pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}()
	cdctest.Wait(e.t, 30*time.Second, "a commit waiting for the standby", func() (bool, string) {
		select {
		case err := <-committed:
			e.t.Fatalf("the commit was not held: %v", err)
		default:
		}
		var ev string
		err := e.pg.Pool().QueryRow(ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev)
		return err == nil && ev == "SyncRep", ev
	})
	return committed
}

// writeLocal writes n transactions of 500 rows of b, the i-th with ids from (first + i) × 1,000
// on, committed with synchronous_commit = local (never held).
func (e *env) writeLocal(first, n int) {
	e.t.Helper()
	conn, err := e.pg.Pool().Acquire(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(e.ctx, `RESET synchronous_commit`)
	if _, err := conn.Exec(e.ctx, `SET synchronous_commit = local`); err != nil {
		e.t.Fatal(err)
	}
	for i := first; i < first+n; i++ {
		if _, err := conn.Exec(e.ctx, `INSERT INTO b SELECT g, md5(g::text) FROM generate_series($1::bigint * 1000, $1::bigint * 1000 + 499) g`, i); err != nil {
			e.t.Fatal(err)
		}
	}
}
