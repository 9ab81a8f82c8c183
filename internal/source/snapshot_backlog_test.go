package source_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	evt "github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/source"
)

// TestSnapshotReadsAheadWhileTheStreamCatchesUp: a stream backlog (20,000 changes of b, written
// while the source was stopped) is in the WAL when the snapshot of an added table a starts. A
// chunk's rows can only enter the queue once the stream reaches its high watermark, behind the
// backlog, but the chunks are read meanwhile, each earned by the bytes the stream moves: the fifth
// chunk is read before the stream has put the first half of the backlog in the queue. (A rule that
// reads at most four chunks ahead of the stream, or waits for a quiet stream, cannot read it before
// the whole backlog is there.) The queue replays to both tables.
func TestSnapshotReadsAheadWhileTheStreamCatchesUp(t *testing.T) {
	e := newEnv(t)
	mid := writeBacklog(e, "ahead")

	// The last moment the pointer was seen below the backlog's middle.
	var below time.Time
	watched := watchBelow(e, "pgrelay:{q}:src:ahead:ptr", mid, func(_ *pointer.Pointer, at time.Time) { below = at })
	stop := e.run("ahead", `[{table: b, queue: q}, {table: a, queue: q}]`, backlogExtra)
	defer stop()
	e.waitTables("ahead", "q", "public.b", "public.a")
	watched()
	res := e.waitOracle("q", 60*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})

	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	readAt := map[string]string{} // chunk (its transaction id, by high watermark) → its read time
	for _, en := range entries {
		if !strings.Contains(en.ID, ":s:") {
			continue
		}
		var ev struct{ TS string }
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		readAt[en.Tx] = ev.TS
	}
	chunks := make([]string, 0, len(readAt))
	for tx := range readAt {
		chunks = append(chunks, tx)
	}
	sort.Strings(chunks) // the high watermark's LSN, 16 hex digits: the order chunks were read
	if len(chunks) < 10 || below.IsZero() {
		t.Fatalf("%d chunks; pointer below the backlog's middle at %v", len(chunks), below)
	}
	fifth, err := time.Parse(evt.TimeFormat, readAt[chunks[4]])
	if err != nil {
		t.Fatal(err)
	}
	if !fifth.Before(below) {
		t.Errorf("the fifth chunk was read at %s, after the stream put half its backlog in the queue (by %s)",
			fifth.Format(evt.TimeFormat), below.UTC().Format(evt.TimeFormat))
	}
	t.Logf("fifth chunk read %v before the stream had half its backlog in the queue; %d events", below.Sub(fifth), res.Events)
}

// TestSnapshotGoesAheadOfTheBacklog: the same backlog (20,000 changes of b written while the source
// was stopped) is in the WAL when the snapshot of the added table a starts; a's rows were written
// long before, so each chunk's rows are older than the slot's catalog_xmin and the chunk goes into
// the queue where the stream is instead of behind the backlog, at its high watermark. A pointer
// still below the backlog's middle already holds a's snapshot progress; under the high-watermark
// rule every chunk's cover lies past the backlog's end. Then, with the source stopped, a's rows are
// updated and a table c is filled: c's rows are younger than the slot's catalog_xmin, so its chunks
// keep their high watermark (as their place and their `r` events' lsn). The queue replays to all
// three tables, and in every partition the events' lsns never go down.
func TestSnapshotGoesAheadOfTheBacklog(t *testing.T) {
	e := newEnv(t)
	mid := writeBacklog(e, "early")

	// The most rows of a the snapshot had in the queue while the pointer was below the backlog's middle.
	var aheadRows int64
	watched := watchBelow(e, "pgrelay:{q}:src:early:ptr", mid, func(p *pointer.Pointer, _ time.Time) {
		var cur struct {
			Table string `json:"table"`
			Rows  int64  `json:"rows"`
		}
		if json.Unmarshal(p.Snapshot, &cur) == nil && cur.Table == "public.a" {
			aheadRows = max(aheadRows, cur.Rows)
		}
	})
	stop := e.run("early", `[{table: b, queue: q}, {table: a, queue: q}]`, backlogExtra)
	e.waitTables("early", "q", "public.b", "public.a")
	watched()
	if aheadRows == 0 {
		t.Errorf("no chunk of a was in the queue before the stream passed the middle of its backlog")
	}
	t.Logf("%d rows of a in the queue before the stream passed the middle of its backlog", aheadRows)

	stop()
	e.pg.Exec(`UPDATE a SET v = 'changed' WHERE id % 3 = 0;
		CREATE TABLE c (id int PRIMARY KEY, v text);
		INSERT INTO c SELECT i, md5(i::text) FROM generate_series(1, 50) i`)
	stop = e.run("early", `[{table: b, queue: q}, {table: a, queue: q}, {table: c, queue: q}]`, backlogExtra)
	defer stop()
	e.waitTables("early", "q", "public.b", "public.a", "public.c")
	e.waitOracle("q", 60*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}, "public.c": {"id"}})

	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		lsn pglogrepl.LSN
		op  string
	}
	last := map[string]seen{} // partition → the last event's lsn and op, in queue order
	var cEarly, cHigh int
	for _, en := range entries {
		var ev struct {
			Op    string `json:"op"`
			Table string `json:"table"`
			LSN   string `json:"lsn"`
		}
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(ev.LSN)
		if err != nil {
			t.Fatalf("entry %s: lsn %q: %v", en.ID, ev.LSN, err)
		}
		k := ev.Table + "/" + en.Partition
		if prev, ok := last[k]; ok && lsn < prev.lsn {
			t.Errorf("%s: %s event at %s after a %s event at %s", k, ev.Op, lsn, prev.op, prev.lsn)
		}
		last[k] = seen{lsn, ev.Op}
		if ev.Table == "public.c" && ev.Op == "r" {
			// the chunk's transaction id holds its high watermark
			if hw := en.Tx[strings.LastIndexByte(en.Tx, ':')+1:]; fmt.Sprintf("%016X", uint64(lsn)) == hw {
				cHigh++
			} else {
				cEarly++
			}
		}
	}
	// c's rows were written while the source was stopped, after the slot's catalog_xmin: its first
	// chunk at least waits for its high watermark (later ones may find the horizon moved on).
	if cHigh == 0 {
		t.Errorf("c: no r event at its high watermark (%d where they went ahead)", cEarly)
	}
	t.Logf("c: %d r events at their high watermark, %d where they went ahead", cHigh, cEarly)
}

// TestSnapshotAheadOfTheBacklogSharesPartitions: a queue's partition is a key's values, whatever
// the table, so a's row 5 and b's row 5 are in one partition. The backlog's last transaction
// updates b's rows 1–200, in the partitions of a's rows; a's chunks go into the queue ahead of the
// backlog, before that update, and their events must carry an lsn no later than where they went:
// the replay requires the lsns never to decrease in a partition.
func TestSnapshotAheadOfTheBacklogSharesPartitions(t *testing.T) {
	e := newEnv(t)
	writeBacklog(e, "shared")
	e.pg.Exec(`UPDATE b SET v = 'late' WHERE id BETWEEN 1 AND 200`)
	stop := e.run("shared", `[{table: b, queue: q}, {table: a, queue: q}]`, backlogExtra)
	defer stop()
	e.waitTables("shared", "q", "public.b", "public.a")
	e.waitOracle("q", 60*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"id"}})

	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{} // partitions where a's row is in the queue
	ahead := 0                // of them, before b's update
	for _, en := range entries {
		var ev struct{ Op, Table string }
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		switch {
		case ev.Op == "r" && ev.Table == "public.a":
			read[en.Partition] = true
		case ev.Op == "u" && ev.Table == "public.b" && read[en.Partition]:
			ahead++
		}
	}
	if ahead == 0 {
		t.Errorf("no row of a came before b's update in its partition")
	}
	t.Logf("a's row came before b's update in %d partitions of 200", ahead)
}

// backlogExtra is the pg_cdc settings of the backlog tests: small chunks and bundles.
const backlogExtra = "snapshot: initial\nchunk_rows: 20\nmax_bundle_messages: 100"

// writeBacklog creates a (200 rows) and b, streams b with source name until it is in, stops, and
// writes 20,000 rows of b in 20 transactions; it returns the WAL position after the tenth.
func writeBacklog(e *env, name string) pglogrepl.LSN {
	t := e.t
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 200) i;
		CREATE TABLE b (id bigint PRIMARY KEY, v text)`)
	stop := e.run(name, `[{table: b, queue: q}]`, backlogExtra)
	e.waitTables(name, "q", "public.b")
	stop()
	var mid pglogrepl.LSN
	for i := range 20 {
		e.pg.Exec(`INSERT INTO b SELECT g, md5(g::text) FROM generate_series($1::bigint * 1000, $1::bigint * 1000 + 999) g`, i)
		if i == 9 {
			var s string
			if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
				t.Fatal(err)
			}
			mid, _ = pglogrepl.ParseLSN(s)
		}
	}
	return mid
}

// watchBelow polls the pointer at key every millisecond and hands each one below mid to seen, with
// the time it was read, until the first at or past mid; the returned func stops it and waits.
func watchBelow(e *env, key string, mid pglogrepl.LSN, seen func(p *pointer.Pointer, at time.Time)) (stop func()) {
	watching := make(chan struct{})
	watched := make(chan struct{})
	rdb := e.rd.Client() // one connection: a client per poll would use up Redis' connections
	go func() {
		defer close(watched)
		for {
			at := time.Now()
			p, err := source.ReadPointer(e.ctx, rdb, key)
			if err == nil && p != nil && p.LSNValue() < mid {
				seen(p, at)
			} else if err == nil && p != nil {
				return
			}
			select {
			case <-watching:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() {
		close(watching)
		<-watched
	}
}
