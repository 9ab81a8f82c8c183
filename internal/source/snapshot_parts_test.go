package source

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// testTable is public.t (id int4 key, big text, n int4) for the chunk tests.
func testTable() *snapTable {
	info := &TableInfo{Table: Table{Schema: "public", Name: "t", Queue: "q", Mode: PartitionByKey}, Key: []string{"id"}}
	cols := []snapshot.Column{{Name: "id", TypeOID: 23}, {Name: "big", TypeOID: 25}, {Name: "n", TypeOID: 23}}
	enc := event.NewTable("public.t", []event.Column{{Name: "id", Type: convert.ScalarType(23)}, {Name: "big", Type: convert.ScalarType(25)},
		{Name: "n", Type: convert.ScalarType(23)}}, []int{0}, []int{0})
	return &snapTable{info: info, full: "public.t", spec: snapshot.Spec{Schema: "public", Name: "t", Columns: cols, Key: []string{"id"}},
		enc: enc, isKey: []bool{true, false, false}, nonKey: []string{"big", "n"}}
}

// TestChunkPartsCarryTheCursor: a 5-row chunk in bundles of 2 goes in parts whose cursors end at
// their last row; the dropped row 2 gets a fill (its update left big unchanged), row 4 (deleted) is
// rowsOf is a chunk's Rows holding rows.
func rowsOf(rows [][][]byte) snapshot.Rows {
	var r snapshot.Rows
	for _, row := range rows {
		r.Append(row)
	}
	return r
}

// dropped; the bundler's covers take lsn = hw − 1, the cursor and S + 1 per part.
func TestChunkPartsCarryTheCursor(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100)
	ss := testSession(2, start)
	ss.src.cfg.ChunkRows = 5
	sn := &snapshotter{ss: ss, epoch: "e"}
	rows := [][][]byte{}
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		rows = append(rows, [][]byte{[]byte(id), []byte("big" + id), []byte("7")})
	}
	cur, _ := snapshot.Start([]string{"public.t", "public.u"})
	p := &pendingChunk{id: "l:1", win: snapshot.NewWindow(), table: testTable(), cursor: cur,
		chunk: &snapshot.Chunk{Rows: rowsOf(rows), LastKey: []string{"5"}, Limit: 5, Snapshot: snapshot.Snapshot{Xmin: 10, Xmax: 10}, ReadAt: time.Unix(0, 0).UTC()}}
	p.win.LowWatermark()
	p.win.Observe(snapshot.Commit{Xid: 11, Effects: []snapshot.Effect{{Key: `{"id":2}`, Unchanged: []string{"big"}}, {Key: `{"id":4}`, Delete: true}}})
	items, err := sn.build(p, 0x500)
	if err != nil {
		t.Fatal(err)
	}
	var ids, cursors []string
	for _, it := range items {
		for _, ev := range it.events {
			ids = append(ids, ev.ID)
		}
		cursors = append(cursors, string(it.chunk.cursor))
	}
	wantIDs := "pg:e:s:0000000000000500:0 pg:e:s:0000000000000500:f1 pg:e:s:0000000000000500:2 pg:e:s:0000000000000500:4"
	if strings.Join(ids, " ") != wantIDs {
		t.Errorf("ids %v, want %s", ids, wantIDs)
	}
	wantCursors := []string{
		`{"tables":["public.t","public.u"],"table":"public.t","after":["2"],"rows":2}`,
		`{"tables":["public.t","public.u"],"table":"public.t","after":["5"],"rows":5}`,
	}
	if strings.Join(cursors, "\n") != strings.Join(wantCursors, "\n") {
		t.Errorf("cursors:\n%s\nwant:\n%s", strings.Join(cursors, "\n"), strings.Join(wantCursors, "\n"))
	}
	fill := string(items[0].events[1].Payload)
	if want := `{"op":"u","table":"public.t","key":{"id":2},"after":{"id":2,"big":"big2"},"before":null,"unchanged":["n"],"lsn":"0/500","ts":"1970-01-01T00:00:00.000000Z","seq":1}`; fill != want {
		t.Errorf("fill %s\nwant %s", fill, want)
	}
	read := string(items[0].events[0].Payload)
	if want := `{"op":"r","table":"public.t","key":{"id":1},"after":{"id":1,"big":"big1","n":7},"before":null,"lsn":"0/500","ts":"1970-01-01T00:00:00.000000Z","seq":0}`; read != want {
		t.Errorf("read %s\nwant %s", read, want)
	}
	// A stream transaction committed before the high watermark goes first; each part is a cover.
	ss.q.tryPush(change(0x400, 0, 1))
	ss.q.tryPush(commitItem(0x400))
	for _, it := range items {
		ss.q.tryPush(it)
	}
	var got []string
	for i := 0; i < 5; i++ {
		b, _, err := ss.bundle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			break
		}
		got = append(got, b.Cover.Position()+" "+string(b.Cover.Snapshot))
	}
	want := []string{
		"00000001/0000000000000400/ffffffffffffffff/0000000000000000 ",
		"00000001/00000000000004ff/ffffffffffffffff/0000000000000001 " + wantCursors[0],
		"00000001/00000000000004ff/ffffffffffffffff/0000000000000002 " + wantCursors[1],
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("covers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The last table's short chunk ends the snapshot: the cursor becomes null.
	last := snapshot.Cursor{Tables: cur.Tables, Table: "public.u"}
	p = &pendingChunk{win: snapshot.NewWindow(), table: testTable(), cursor: last, chunk: &snapshot.Chunk{Rows: rowsOf(rows[:1]), LastKey: []string{"1"}, Limit: 5}}
	items, _ = sn.build(p, 0x600)
	var parsed *snapshot.Cursor
	if len(items) != 1 || json.Unmarshal(items[0].chunk.cursor, &parsed) != nil || parsed != nil || !p.over {
		t.Errorf("last chunk: %d items, cursor %s, over %v", len(items), items[0].chunk.cursor, p.over)
	}
}

// TestRemovedTableReadsAsAnEmptyChunk: a table that left `tables` while its snapshot ran is
// skipped: its chunk is empty and the cursor moves to the next table.
func TestRemovedTableReadsAsAnEmptyChunk(t *testing.T) {
	ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
	ss.src.cfg.ChunkRows = 5
	ss.src.log = testLogger{t}
	sn := &snapshotter{ss: ss, epoch: "e", tables: map[string]*snapTable{}}
	tab, err := sn.load(context.Background(), "public.gone")
	if err != nil || tab != nil {
		t.Fatalf("load: %v %v", tab, err)
	}
	ch, err := sn.read(context.Background(), tab, snapshot.Cursor{})
	if err != nil || ch.Rows.Len() != 0 {
		t.Fatalf("read: %v %v", ch, err)
	}
	p := &pendingChunk{win: snapshot.NewWindow(), cursor: snapshot.Cursor{Tables: []string{"public.gone", "public.u"}, Table: "public.gone"}, chunk: ch}
	items, err := sn.build(p, 0x700)
	if err != nil || len(items) != 1 || len(items[0].events) != 0 || p.next.Table != "public.u" || p.over {
		t.Fatalf("build: %d items, next %+v, over %v, err %v", len(items), p.next, p.over, err)
	}
}

// testLogger sends a Source's log lines to the test log.
type testLogger struct{ t *testing.T }

func (l testLogger) Infof(f string, a ...any)  { l.t.Logf(f, a...) }
func (l testLogger) Warnf(f string, a ...any)  { l.t.Logf(f, a...) }
func (l testLogger) Errorf(f string, a ...any) { l.t.Logf(f, a...) }

// TestSnapshotStopsObservingWhenDone: once the last chunk's high watermark is resolved, commits on
// the last table are no longer kept for later chunks (there are none), so the history does not grow
// for as long as the session streams on.
func TestSnapshotStopsObservingWhenDone(t *testing.T) {
	ss := testSession(2, pointer.New(1, "e", "s", "x", 100))
	ss.src.cfg.ChunkRows = 5
	sn := &snapshotter{ss: ss, epoch: "e"}
	sn.setActive("public.t")
	ev := func(xid uint32) item {
		return item{kind: itemChange, events: []Event{{Table: "public.t", Op: event.OpInsert, Xid: xid, Payload: []byte(`{"key":{"id":1}}`)}}}
	}
	sn.observe(ev(9))
	sn.observe(commitItem(0x500))
	if len(sn.history) != 1 {
		t.Fatalf("while the snapshot runs: history %d, want 1", len(sn.history))
	}
	cur := snapshot.Cursor{Tables: []string{"public.t"}, Table: "public.t"}
	p := &pendingChunk{id: "l:1", win: snapshot.NewWindow(), table: testTable(), cursor: cur, done: make(chan struct{}),
		chunk: &snapshot.Chunk{Rows: rowsOf([][][]byte{{[]byte("1"), []byte("b"), []byte("7")}}), LastKey: []string{"1"}, Limit: 5, // short: the last
			Snapshot: snapshot.Snapshot{Xmin: 5, Xmax: 5}}}
	p.win.LowWatermark()
	sn.pending = []*pendingChunk{p}
	if ok, err := sn.highWatermark("l:1", 0x600, func(item) error { return nil }); !ok || err != nil || !p.over {
		t.Fatalf("last chunk: resolved %v, err %v, over %v", ok, err, p.over)
	}
	for xid := uint32(10); xid < 1010; xid++ {
		sn.observe(ev(xid))
		sn.observe(commitItem(pglogrepl.LSN(0x600 + xid)))
	}
	if len(sn.history) != 0 {
		t.Fatalf("after the snapshot: %d commits kept", len(sn.history))
	}
}
