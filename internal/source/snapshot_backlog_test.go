package source_test

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	evt "github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/oracle"
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
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 200) i;
		CREATE TABLE b (id bigint PRIMARY KEY, v text)`)
	extra := "snapshot: initial\nchunk_rows: 20\nmax_bundle_messages: 100"
	stop := e.run("ahead", `[{table: b, queue: q}]`, extra)
	e.waitTables("ahead", "q", "public.b")
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

	// The last moment the pointer was seen below the backlog's middle.
	var below time.Time
	watching := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			at := time.Now()
			p, err := source.ReadPointer(e.ctx, e.rd.Client(), "pgrelay:{q}:src:ahead:ptr")
			if err == nil && p != nil && p.LSNValue() < mid {
				below = at
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
	stop = e.run("ahead", `[{table: b, queue: q}, {table: a, queue: q}]`, extra)
	defer stop()
	e.waitTables("ahead", "q", "public.b", "public.a")
	close(watching)
	<-watched
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
