package source_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
)

// randomWriter changes rows of tables a (id int) and b (composite text key with | and \) until
// halted: inserts, updates, deletes, key changes, and the same row twice in one transaction.
type randomWriter struct {
	stop chan struct{}
	wait func() int
	n    int // statements that succeeded, once halted
}

// bKey is a text key part with the characters partition names escape.
func bKey(i int) string {
	return []string{`x|y`, `x\y`, `p`, `\|`, `q|`}[i%5] + fmt.Sprint(i/5)
}

func startRandomWriter(t *testing.T, pool *pgxpool.Pool, keys int) *randomWriter {
	w := &randomWriter{stop: make(chan struct{})}
	w.wait = cdctest.Writers(1, 1, 0, w.stop, func(r *rand.Rand) bool {
		err := randomStatement(pool, r, keys)
		if err != nil && !strings.Contains(err.Error(), "duplicate key") {
			t.Logf("writer: %v", err)
		}
		return err == nil
	})
	return w
}

func randomStatement(pool *pgxpool.Pool, r *rand.Rand, keys int) error {
	ctx := context.Background()
	id, id2 := r.IntN(keys), r.IntN(keys)
	var sql string
	switch r.IntN(9) {
	case 0:
		sql = fmt.Sprintf(`INSERT INTO a VALUES (%d, md5(random()::text), %d) ON CONFLICT DO NOTHING`, id, r.IntN(1000))
	case 1:
		sql = fmt.Sprintf(`UPDATE a SET v = md5(random()::text), n = n + 1 WHERE id = %d`, id)
	case 2:
		sql = fmt.Sprintf(`DELETE FROM a WHERE id = %d`, id)
	case 3:
		sql = fmt.Sprintf(`UPDATE a SET id = %d WHERE id = %d AND NOT EXISTS (SELECT 1 FROM a WHERE id = %d)`, id2, id, id2)
	case 4: // the same row twice in one transaction
		sql = fmt.Sprintf(`BEGIN; UPDATE a SET n = n + 1 WHERE id = %d; UPDATE a SET v = 'twice' WHERE id = %d; COMMIT`, id, id)
	case 5:
		sql = fmt.Sprintf(`INSERT INTO b VALUES (%s, 'k', md5(random()::text)) ON CONFLICT DO NOTHING`, lit(bKey(id)))
	case 6:
		sql = fmt.Sprintf(`UPDATE b SET v = md5(random()::text) WHERE k1 = %s`, lit(bKey(id)))
	case 7:
		sql = fmt.Sprintf(`DELETE FROM b WHERE k1 = %s`, lit(bKey(id)))
	case 8:
		sql = fmt.Sprintf(`BEGIN; UPDATE b SET k2 = 'moved' WHERE k1 = %s AND k2 = 'k'; UPDATE b SET v = 'again' WHERE k1 = %s; COMMIT`,
			lit(bKey(id)), lit(bKey(id)))
	}
	_, err := pool.Exec(ctx, sql)
	if err != nil {
		_, _ = pool.Exec(ctx, "ROLLBACK")
	}
	return err
}

func lit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (w *randomWriter) halt() {
	close(w.stop)
	w.n = w.wait()
}

// snapshotCursor reads the pointer's snapshot field ("null" when done).
func (e *env) snapshotCursor(name, queue string) (string, *source.Status) {
	e.t.Helper()
	p, err := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{"+queue+"}:src:"+name+":ptr")
	if err != nil {
		e.t.Fatal(err)
	}
	if p == nil {
		return "", nil
	}
	return string(p.Snapshot), nil
}

// waitSnapshotDone waits until the pointer's snapshot field is null.
func (e *env) waitSnapshotDone(name, queue string, within time.Duration) {
	e.t.Helper()
	cdctest.WaitEvery(e.t, within, 100*time.Millisecond, "the snapshot of "+name+" done", func() (bool, string) {
		cur, _ := e.snapshotCursor(name, queue)
		return cur == "null", "cursor " + cur
	})
}

// waitOracle polls until the replay of queue equals every table, then reports what still differs.
func (e *env) waitOracle(queue string, within time.Duration, tables map[string][]string) *oracle.Result {
	e.t.Helper()
	deadline := time.Now().Add(within)
	conn := e.conn()
	for {
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", queue)
		if err != nil {
			e.t.Fatal(err)
		}
		res := oracle.Replay(entries)
		var diffs []string
		for table, key := range tables {
			rows, err := oracle.TableRows(e.ctx, conn, table, key)
			if err != nil {
				e.t.Fatal(err)
			}
			diffs = append(diffs, oracle.Compare(res.Tables[table], rows)...)
		}
		if len(diffs) == 0 || time.Now().After(deadline) {
			for _, p := range res.Problems {
				e.t.Error(p)
			}
			for i, d := range diffs {
				if i == 20 {
					e.t.Errorf("... %d more", len(diffs)-20)
					break
				}
				e.t.Error(short(d))
				if i < 3 {
					e.logHistory(entries, d)
				}
			}
			return res
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func countOps(t *testing.T, res []oracle.Entry) map[string]int {
	out := map[string]int{}
	for _, en := range res {
		var ev struct {
			Op string `json:"op"`
		}
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(en.ID, ":s:") {
			out["snap-"+ev.Op]++
		} else {
			out[ev.Op]++
		}
	}
	return out
}

// TestSnapshotWhileRandomWriter: a random writer starts before the source and keeps changing rows
// in the chunks being read (100-row chunks, two tables, one with a composite text key holding | and
// \): the replay of the queue equals both tables, every id once.
func TestSnapshotWhileRandomWriter(t *testing.T) {
	e := newEnv(t)
	w := e.seedSnapshotTables(t)
	e.run("snap", `[{table: a, queue: q}, {table: b, queue: q}]`, "snapshot: initial\nchunk_rows: 100\nmax_bundle_messages: 40")
	e.waitPointer("snap", "q")
	e.waitSnapshotDone("snap", "q", 90*time.Second)
	time.Sleep(500 * time.Millisecond)
	w.halt()
	res := e.waitOracle("q", 30*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"k1", "k2"}})
	entries, _ := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	ops := countOps(t, entries)
	t.Logf("writer: %d statements; queue: %d events %v", w.n, res.Events, ops)
	if ops["snap-r"] < 1000 {
		t.Errorf("only %d snapshot rows", ops["snap-r"])
	}
}

// TestSnapshotFillsToastedValues: rows with 20-100 kB STORAGE EXTERNAL values are updated only in
// other columns while the snapshot reads them (so their stream events leave the value unchanged),
// and TOASTed rows change key: replaying the queue gives every value (length and md5).
func TestSnapshotFillsToastedValues(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, n int, big text);
		ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
		INSERT INTO t SELECT i, 0, repeat(md5(i::text), 625 + (i * 7919) % 2500) FROM generate_series(1, 400) i`)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var updates atomic.Int64
	for w := range 2 { // two writers: the chunk being read is hit more often
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(3+uint64(w), 4))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := 1 + r.IntN(400)
				if after := e.cursorAfter("toast", "q"); after > 0 && r.IntN(4) > 0 {
					// The chunk being read: the snapshot reads the next chunk while the one the
					// pointer is in (20 rows each) waits to be written.
					id = (after/20+1)*20 + 1 + r.IntN(20)
				}
				sql := fmt.Sprintf(`UPDATE t SET n = n + 1 WHERE id = %d`, id)
				if n := updates.Add(1); n%10 == 5 { // a key change of a TOASTed row (d + c with the value read back)
					sql = fmt.Sprintf(`UPDATE t SET id = id + 1000 WHERE id = %d`, id)
				}
				if _, err := e.pg.Pool().Exec(context.Background(), sql); err != nil && !strings.Contains(err.Error(), "duplicate") {
					t.Logf("writer: %v", err)
				}
			}
		}()
	}
	e.run("toast", `[{table: t, queue: q}]`, "snapshot: initial\nchunk_rows: 20\nmax_bundle_bytes: 1048576")
	e.waitPointer("toast", "q")
	e.updateInsideAChunkWindow(t)
	e.waitSnapshotDone("toast", "q", 90*time.Second)
	close(stop)
	wg.Wait()
	res := e.waitOracle("q", 30*time.Second, map[string][]string{"public.t": {"id"}})
	var sizes, sums string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT string_agg(length(big)::text, ',' ORDER BY id), string_agg(md5(big), ',' ORDER BY id) FROM t`).Scan(&sizes, &sums); err != nil {
		t.Fatal(err)
	}
	var replayedSizes, replayedSums []string
	rows := res.Tables["public.t"]
	keys := make([]int, 0, len(rows))
	byID := map[int]string{}
	for _, row := range rows {
		var id int
		var big string
		_ = json.Unmarshal([]byte(row["id"]), &id)
		_ = json.Unmarshal([]byte(row["big"]), &big)
		keys = append(keys, id)
		byID[id] = big
	}
	sortInts(keys)
	for _, id := range keys {
		replayedSizes = append(replayedSizes, fmt.Sprint(len(byID[id])))
		replayedSums = append(replayedSums, md5hex(byID[id]))
	}
	if strings.Join(replayedSizes, ",") != sizes || strings.Join(replayedSums, ",") != sums {
		t.Errorf("replayed lengths/md5 differ from the table")
	}
	entries, _ := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	ops := countOps(t, entries)
	t.Logf("writer: %d updates; queue: %v", updates.Load(), ops)
	if ops["snap-u"] == 0 || ops["c"] == 0 {
		t.Errorf("no fill event or no key change: the test did not exercise them")
	}
}

// updateInsideAChunkWindow makes sure a chunk of t has updates of its rows that leave the TOASTed
// value out of the WAL between its watermarks, whatever the timing: it locks t, waits until a
// chunk's read (after its low watermark) waits for the lock, updates every row in the locking
// transaction and commits. The chunk's read then runs, and its high watermark follows the updates.
func (e *env) updateInsideAChunkWindow(t *testing.T) {
	t.Helper()
	cdctest.Wait(t, 60*time.Second, "a chunk written (the snapshot under way)", func() (bool, string) {
		return e.cursorAfter("toast", "q") > 0, ""
	})
	tx, err := e.pg.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	if _, err := tx.Exec(e.ctx, `LOCK TABLE t IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cdctest.Wait(t, 30*time.Second, "a chunk's read waiting for the lock", func() (bool, string) {
		var n int
		err := e.pg.Pool().QueryRow(e.ctx, chunkReadsWaiting, `"public"."t"`).Scan(&n)
		return err == nil && n > 0, fmt.Sprint(err)
	})
	if _, err := tx.Exec(e.ctx, `UPDATE t SET n = n + 1`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
}

func sortInts(v []int) { sort.Ints(v) }

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// logHistory logs the queue entries of the row a diff line names ("row <key> ..." or "missing row <key>").
func (e *env) logHistory(entries []oracle.Entry, diff string) {
	f := strings.Fields(strings.TrimPrefix(strings.TrimPrefix(diff, "missing "), "extra "))
	if len(f) < 2 {
		return
	}
	key := strings.TrimSuffix(f[1], ";")
	for _, en := range entries {
		var ev oracle.Event
		if json.Unmarshal(en.Payload, &ev) == nil && strings.TrimSuffix(oracle.KeyText(ev.Key), ";") == key {
			e.t.Logf("  %s %s", en.ID, short(string(en.Payload)))
		}
		if json.Unmarshal(en.Payload, &ev) == nil && ev.Before != nil && strings.Contains(oracle.KeyText(ev.Before), key) {
			e.t.Logf("  (before) %s %s", en.ID, short(string(en.Payload)))
		}
	}
}

// TestSlotLostThenResync: the slot is dropped while writes go on → slot_lost; `pgrelay resync`
// (RequestResync) → a new epoch whose snapshot completes; the replay of the new epoch alone equals
// the table, and no id repeats across the two epochs.
func TestSlotLostThenResync(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE r (id int PRIMARY KEY, v text);
		INSERT INTO r SELECT i, md5(i::text) FROM generate_series(1, 300) i`)
	stopW := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(5, 6))
		for {
			select {
			case <-stopW:
				return
			case <-time.After(2 * time.Millisecond):
			}
			id := 1 + rnd.IntN(400)
			sql := []string{`INSERT INTO r VALUES (%d, 'new') ON CONFLICT (id) DO UPDATE SET v = 'upserted'`,
				`UPDATE r SET v = md5(random()::text) WHERE id = %d`, `DELETE FROM r WHERE id = %d`}[rnd.IntN(3)]
			_, _ = e.pg.Pool().Exec(context.Background(), fmt.Sprintf(sql, id))
		}
	}()
	e.run("rs", `[{table: r, queue: q}]`, "snapshot: initial\nchunk_rows: 50")
	e.waitPointer("rs", "q")
	e.waitSnapshotDone("rs", "q", 60*time.Second)
	first, _ := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{q}:src:rs:ptr")
	// Drop the slot under the running source (it reconnects at once; DropSlot ends its walsender and retries).
	e.pg.DropSlot("pgrelay_rs")
	e.waitStatus("q", "rs", `"code":"slot_lost"`)
	conf, err := input.PgCDCSpec().ParseYAML(fmt.Sprintf("name: rs\ndsn: %s\ntables: [{table: r, queue: q}]\nredis: {url: %s}\n", e.pg.DSN(), e.rd.URL()), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := input.PgCDCConfigFromParsed(conf)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := source.RequestResync(e.ctx, cfg, &out); err != nil {
		t.Fatal(err)
	}
	cdctest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, "a finished resync", func() (bool, string) {
		p, _ := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{q}:src:rs:ptr")
		if p != nil && p.Epoch != first.Epoch && string(p.Snapshot) == "null" {
			if p.Gen != first.Gen+1 {
				t.Errorf("generation %d after %d", p.Gen, first.Gen)
			}
			return true, ""
		}
		return false, fmt.Sprintf("pointer %+v", p)
	})
	time.Sleep(300 * time.Millisecond)
	close(stopW)
	wg.Wait()
	p, _ := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{q}:src:rs:ptr")
	all, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the tail of the writes, then replay the new epoch alone.
	conn := e.conn()
	deadline := time.Now().Add(30 * time.Second)
	for {
		all, _ = oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
		var mine []oracle.Entry
		for _, en := range all {
			if strings.HasPrefix(en.ID, "pg:"+p.Epoch+":") {
				mine = append(mine, en)
			}
		}
		res := oracle.Replay(mine)
		rows, err := oracle.TableRows(e.ctx, conn, "public.r", []string{"id"})
		if err != nil {
			t.Fatal(err)
		}
		diffs := oracle.Compare(res.Tables["public.r"], rows)
		if len(diffs) == 0 || time.Now().After(deadline) {
			for _, d := range append(res.Problems, diffs...) {
				t.Error(short(d))
			}
			t.Logf("new epoch %s: %d events; queue %d entries", p.Epoch, len(mine), len(all))
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	seen := map[string]bool{}
	for _, en := range all {
		if seen[en.ID] {
			t.Errorf("id %s twice", en.ID)
		}
		seen[en.ID] = true
	}
	if n, _ := e.rd.Client().Exists(e.ctx, "pgrelay:{q}:src:rs:resync").Result(); n != 0 {
		t.Error("the resync key was not deleted")
	}
}

// TestSnapshotReadEqualsInsertForAnyKeyType: a composite key of bpchar, numeric, timestamptz and
// uuid (3-row chunks, so the cursor compares every type) with arrays, jsonb and bytea around it:
// every row's r event has exactly the key and after bytes of the c event the stream gives when the
// same row is inserted again.
func TestSnapshotReadEqualsInsertForAnyKeyType(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE k (a character(6), b numeric, c timestamptz, d uuid, e text, j jsonb, arr int[], by bytea, f float8,
			PRIMARY KEY (a, b, c, d));
		INSERT INTO k SELECT chr(97 + i % 3), (i % 4) * 1.10, '2026-01-01 00:00+02'::timestamptz + (i % 2) * interval '1 hour',
			md5(i::text)::uuid, 'x|y\z' || i, jsonb_build_object('n', i, 'big', 12345678901234567890), ARRAY[i, NULL, 3],
			decode(md5(i::text), 'hex'), i / 3.0
		FROM generate_series(1, 20) i;
		CREATE TABLE k_copy AS SELECT * FROM k`)
	e.run("types", `[{table: k, queue: q}]`, "snapshot: initial\nchunk_rows: 3")
	e.waitPointer("types", "q")
	e.waitSnapshotDone("types", "q", 60*time.Second)
	e.pg.Exec(`BEGIN; DELETE FROM k; INSERT INTO k SELECT * FROM k_copy; COMMIT`)
	entries := e.waitEntries("q", 60)
	type kv struct{ key, after string }
	reads, inserts := map[string]kv{}, map[string]kv{}
	for _, en := range entries {
		ev := event(t, en)
		switch string(ev["op"]) {
		case `"r"`:
			reads[string(ev["key"])] = kv{string(ev["key"]), string(ev["after"])}
		case `"c"`:
			inserts[string(ev["key"])] = kv{string(ev["key"]), string(ev["after"])}
		}
	}
	if len(reads) != 20 || len(inserts) != 20 {
		t.Fatalf("%d reads, %d inserts, want 20 each", len(reads), len(inserts))
	}
	for k, r := range reads {
		if inserts[k] != r {
			t.Errorf("r and c differ:\n r %s\n c %s", r.after, inserts[k].after)
		}
	}
	e.checkOracle("q", "public.k", "a", "b", "c", "d")
}

// cursorAfter is the first key value of the pointer's snapshot cursor as an int (0 when none).
func (e *env) cursorAfter(name, queue string) int {
	p, err := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{"+queue+"}:src:"+name+":ptr")
	if err != nil || p == nil {
		return 0
	}
	var c struct {
		After []string `json:"after"`
	}
	if json.Unmarshal(p.Snapshot, &c) != nil || len(c.After) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(c.After[0])
	return n
}

// seedSnapshotTables creates the snapshot tests' tables (a: 1,500 rows keyed by int; b: 1,000 rows
// with a composite text key holding | and \) and starts a random writer on them.
func (e *env) seedSnapshotTables(t *testing.T) *randomWriter {
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text, n int);
		CREATE TABLE b (k1 text, k2 text, v text, PRIMARY KEY (k1, k2));
		INSERT INTO a SELECT i, md5(i::text), i FROM generate_series(0, 1499) i;`)
	for i := 0; i < 1000; i++ {
		e.pg.Exec(`INSERT INTO b VALUES ($1, 'k', md5($1))`, bKey(i))
	}
	w := startRandomWriter(t, e.pg.Pool(), 1500)
	time.Sleep(300 * time.Millisecond)
	return w
}
