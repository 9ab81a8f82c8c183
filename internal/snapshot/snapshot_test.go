package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestParseSnapshotAndSees(t *testing.T) {
	snap, err := ParseSnapshot("100:110:102,105")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		xid  uint32
		sees bool
	}{{99, true}, {100, true}, {101, true}, {102, false}, {105, false}, {109, true}, {110, false}, {200, false}}
	for _, c := range cases {
		if got := snap.Sees(c.xid); got != c.sees {
			t.Errorf("Sees(%d) = %v, want %v", c.xid, got, c.sees)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x"} {
		if _, err := ParseSnapshot(bad); err == nil {
			t.Errorf("ParseSnapshot(%q) accepted", bad)
		}
	}
}

func TestWidenAcrossEpochs(t *testing.T) {
	const e = uint64(3) << 32
	snap := Snapshot{Xmin: e + 5, Xmax: e + 10}
	cases := []struct {
		xid  uint32
		want uint64
	}{
		{5, e + 5},
		{9, e + 9},
		{0xFFFFFFF0, e - 16}, // just before the 32-bit wraparound: previous epoch
	}
	// the epoch's last xids, and the next epoch's first ones (a transaction begun after the snapshot)
	end := Snapshot{Xmin: e - 20, Xmax: e - 10}
	cases2 := []struct {
		xid  uint32
		want uint64
	}{{0xFFFFFFF0, e - 16}, {0xFFFFFFFF, e - 1}, {3, e + 3}, {0x7FFFFFF0, e + 0x7FFFFFF0}}
	for _, c := range cases2 {
		if got := end.Widen(c.xid); got != c.want {
			t.Errorf("xmax %d: Widen(%d) = %d, want %d", end.Xmax, c.xid, got, c.want)
		}
	}
	if end.Sees(3) {
		t.Error("an xid of the next epoch is visible to a snapshot of the epoch before")
	}
	// epoch 0: nothing comes before xid 3
	first := Snapshot{Xmin: 100, Xmax: 100}
	if got := first.Widen(0xFFFFFF00); got != 0xFFFFFF00 {
		t.Errorf("epoch 0: Widen(0xFFFFFF00) = %d", got)
	}
	for _, c := range cases {
		if got := snap.Widen(c.xid); got != c.want {
			t.Errorf("Widen(%d) = %d, want %d", c.xid, got, c.want)
		}
	}
}

func TestWindowResolve(t *testing.T) {
	snap := Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{105}}
	rows := []Row{{Key: "1"}, {Key: "2"}, {Key: "3"}, {Key: "4"}, {Key: "5"}}
	cols := []string{"a", "big", "doc"}
	type obs struct {
		between bool
		c       Commit
	}
	upd := func(key string, unchanged ...string) Effect { return Effect{Key: key, Unchanged: unchanged} }
	cases := []struct {
		name      string
		observed  []obs
		survivors []string
		fills     map[string][]string
	}{
		{"quiet window keeps all", nil, []string{"1", "2", "3", "4", "5"}, nil},
		{"commit between watermarks drops its keys",
			[]obs{{true, Commit{Xid: 108, Effects: []Effect{upd("2"), {Key: "4", Delete: true}}}}},
			[]string{"1", "3", "5"}, nil},
		{"commit before low watermark seen by the snapshot is kept",
			[]obs{{false, Commit{Xid: 101, Effects: []Effect{upd("2")}}}},
			[]string{"1", "2", "3", "4", "5"}, nil},
		{"commit before low watermark invisible to the snapshot drops",
			[]obs{{false, Commit{Xid: 105, Effects: []Effect{upd("3")}}}},
			[]string{"1", "2", "4", "5"}, nil},
		{"truncate drops the whole chunk",
			[]obs{{true, Commit{Xid: 108, Truncate: true}}}, nil, nil},
		{"update leaving TOAST unchanged gets a fill",
			[]obs{{true, Commit{Xid: 108, Effects: []Effect{upd("1", "big", "doc")}}}},
			[]string{"2", "3", "4", "5"}, map[string][]string{"1": {"big", "doc"}}},
		{"fill keeps only columns unchanged by every update",
			[]obs{{true, Commit{Xid: 108, Effects: []Effect{upd("1", "big", "doc")}}},
				{true, Commit{Xid: 109, Effects: []Effect{upd("1", "doc")}}}},
			[]string{"2", "3", "4", "5"}, map[string][]string{"1": {"doc"}}},
		{"insert carries every column: no fill",
			[]obs{{true, Commit{Xid: 108, Effects: []Effect{{Key: "1", Put: true}, upd("1", "big")}}}},
			[]string{"2", "3", "4", "5"}, nil},
		{"row deleted at the end: no fill",
			[]obs{{true, Commit{Xid: 108, Effects: []Effect{upd("1", "big"), {Key: "1", Delete: true}}}}},
			[]string{"2", "3", "4", "5"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewWindow()
			for _, o := range c.observed {
				if o.between && !w.Seen() {
					w.LowWatermark()
				}
				w.Observe(o.c)
			}
			surv, fills := w.Resolve(rows, snap, cols)
			var got []string
			for _, r := range surv {
				got = append(got, r.Key)
			}
			if !reflect.DeepEqual(got, c.survivors) {
				t.Errorf("survivors %v, want %v", got, c.survivors)
			}
			gotFills := map[string][]string{}
			for _, f := range fills {
				gotFills[f.Row.Key] = f.Columns
			}
			if len(c.fills) == 0 && len(gotFills) == 0 {
				return
			}
			if !reflect.DeepEqual(gotFills, c.fills) {
				t.Errorf("fills %v, want %v", gotFills, c.fills)
			}
		})
	}
}

func TestCursorAdvance(t *testing.T) {
	c, ok := Start([]string{"public.a", "public.b"})
	if !ok {
		t.Fatal("no start")
	}
	c, done := c.Advance(100, []string{"k100"}, 100)
	if done || c.Table != "public.a" || c.Rows != 100 || c.After[0] != "k100" {
		t.Fatalf("full chunk: %+v", c)
	}
	c, done = c.Advance(7, []string{"k107"}, 100)
	if done || c.Table != "public.b" || c.After != nil || c.Rows != 0 {
		t.Fatalf("short chunk: %+v", c)
	}
	if _, done = c.Advance(0, nil, 100); !done {
		t.Fatal("last table not done")
	}
	if _, ok := Start(nil); ok {
		t.Fatal("empty start")
	}
}

// TestReadPagesCompositeKeyInOrder reads a table with a composite text+bpchar+int key whose values
// contain | and \ in chunks of 7 and checks every row comes once, in key order, with bpchar padding.
func TestReadPagesCompositeKeyInOrder(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE odd (a text, b character(6), c int, v numeric, PRIMARY KEY (a, b, c))`)
	pg.Exec(`INSERT INTO odd SELECT
	           (ARRAY['x|y', 'x\y', 'plain', '', 'x\|'])[1 + i % 5], chr(97 + i % 3), i, i * 1.5
	         FROM generate_series(1, 60) i`)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	spec := Spec{Schema: "public", Name: "odd", Key: []string{"a", "b", "c"}, Columns: []Column{
		{Name: "a", SQLType: "text"}, {Name: "b", SQLType: "character(6)"}, {Name: "c", SQLType: "integer"}, {Name: "v", SQLType: "numeric"}}}
	var got []string
	var after []string
	for i := 0; i < 20; i++ {
		ch, err := spec.Read(ctx, conn, after, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ch.Rows.All() {
			got = append(got, fmt.Sprintf("%s/%s/%s/%s", r[0], r[1], r[2], r[3]))
		}
		if ch.Rows.Len() < 7 {
			break
		}
		after = ch.LastKey
	}
	var want []string
	res := conn.Exec(ctx, `SELECT a || '/' || b::text || repeat(' ', 6 - length(b)) || '/' || c || '/' || v FROM odd ORDER BY a, b, c`)
	rs, err := res.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs[0].Rows {
		want = append(want, string(r[0]))
	}
	if len(got) != 60 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("chunks read %d rows:\n%s\nwant:\n%s", len(got), strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestReadRecordsInProgressTransactions checks a chunk's snapshot does not see a transaction that
// was open while it read.
func TestReadRecordsInProgressTransactions(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY)`)
	ctx := context.Background()
	open, err := pg.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	var xid uint32
	if err := open.QueryRow(ctx, `INSERT INTO t VALUES (1) RETURNING xmin::text::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	spec := Spec{Schema: "public", Name: "t", Key: []string{"id"}, Columns: []Column{{Name: "id", SQLType: "integer"}}}
	ch, err := spec.Read(ctx, conn, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Rows.Len() != 0 || ch.Snapshot.Sees(xid) {
		t.Fatalf("chunk saw the open transaction %d: rows %d snapshot %+v", xid, ch.Rows.Len(), ch.Snapshot)
	}
	var committed uint32
	if err := pg.Pool().QueryRow(ctx, `INSERT INTO t VALUES (2) RETURNING xmin::text::bigint`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	ch, err = spec.Read(ctx, conn, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Rows.Len() != 1 || !ch.Snapshot.Sees(committed) || ch.Snapshot.Sees(xid) {
		t.Fatalf("second chunk: rows %d snapshot %+v", ch.Rows.Len(), ch.Snapshot)
	}
}

func TestQueryRefusesBadSpecs(t *testing.T) {
	cases := []struct {
		name  string
		spec  Spec
		after []string
	}{
		{"no key", Spec{Schema: "s", Name: "t", Columns: []Column{{Name: "a", SQLType: "int"}}}, nil},
		{"key not read", Spec{Schema: "s", Name: "t", Key: []string{"b"}, Columns: []Column{{Name: "a", SQLType: "int"}}}, nil},
		{"cursor arity", Spec{Schema: "s", Name: "t", Key: []string{"a"}, Columns: []Column{{Name: "a", SQLType: "int"}}}, []string{"1", "2"}},
	}
	for _, c := range cases {
		if _, _, err := c.spec.Query(c.after, 10); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	q, args, err := Spec{Schema: "we\"ird", Name: "T", Key: []string{"K"}, Columns: []Column{{Name: "K", SQLType: "character(3)"}}}.Query([]string{"a  "}, 5)
	if err != nil || q != `SELECT "K" FROM "we""ird"."T" WHERE ("K") > ($1::character(3)) ORDER BY "K" LIMIT 5` || args[0] != "a  " {
		t.Fatalf("query %q %v %v", q, args, err)
	}
}

// TestReadBetweenReusesBuffers reads a table chunk after chunk, each read given the Buffers of the
// one before, and checks every chunk holds the same values as a read into new memory (NULL stays
// nil, an empty value empty, a value larger than a block whole) while the memory is the earlier
// chunk's.
func TestReadBetweenReusesBuffers(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE r (id int PRIMARY KEY, v text)`)
	pg.Exec(`INSERT INTO r SELECT i, CASE WHEN i % 5 = 0 THEN NULL WHEN i % 5 = 1 THEN '' WHEN i = 13 THEN repeat('x', 300000)
	         ELSE repeat(md5(i::text), i % 4) END FROM generate_series(1, 40) i`)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	spec := Spec{Schema: "public", Name: "r", Key: []string{"id"}, Columns: []Column{{Name: "id", SQLType: "integer"}, {Name: "v", SQLType: "text"}}}
	text := func(ch *Chunk) []string {
		var out []string
		for _, r := range ch.Rows.All() {
			for _, v := range r {
				switch {
				case v == nil:
					out = append(out, "NULL")
				case len(v) == 0:
					out = append(out, "''")
				default:
					out = append(out, string(v))
				}
			}
		}
		return out
	}
	for _, limit := range []int{1, 7, 40, 100} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var buf *Buffers
			var after []string
			blocks := map[*byte]bool{} // the blocks of valueBlock bytes the reads filled
			rows := 0
			for {
				ch, _, err := spec.ReadBetween(ctx, conn, after, limit, nil, nil, nil, buf)
				if err != nil {
					t.Fatal(err)
				}
				if buf != nil && ch.Buffers != buf {
					t.Fatal("the chunk does not keep the Buffers it was read into")
				}
				for _, b := range ch.Rows.blocks {
					if cap(b) == valueBlock {
						blocks[unsafe.SliceData(b)] = true
					}
				}
				if len(blocks) > 2 {
					t.Fatalf("after %v: the reads filled %d blocks, not the earlier chunks' memory", after, len(blocks))
				}
				got := text(ch)
				want, err := spec.Read(ctx, conn, after, limit) // new memory
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(got, "|") != strings.Join(text(want), "|") {
					t.Fatalf("after %v: got %.200q, want %.200q", after, got, text(want))
				}
				rows += ch.Rows.Len()
				if ch.Rows.Len() < limit {
					break
				}
				buf, after = ch.Buffers, ch.LastKey
			}
			if rows != 40 {
				t.Fatalf("read %d rows, want 40", rows)
			}
		})
	}
}

func TestPrecedesAndBefore(t *testing.T) {
	for _, c := range []struct {
		name     string
		a, b     uint32
		precedes bool
	}{
		{"older", 100, 200, true},
		{"newer", 200, 100, false},
		{"equal", 100, 100, false},
		{"across the wrap", 0xFFFFFFF0, 5, true},
		{"after the wrap", 5, 0xFFFFFFF0, false},
		{"half the space back", 10, 10 + 1<<31 - 1, true},
	} {
		if got := Precedes(c.a, c.b); got != c.precedes {
			t.Errorf("%s: Precedes(%d, %d) = %v", c.name, c.a, c.b, got)
		}
	}
	for _, c := range []struct {
		in string
		v  uint32
		ok bool
	}{
		{"0", 0, true}, {"742", 742, true}, {"4294967295", 4294967295, true},
		{"4294967296", 0, false}, {"", 0, false}, {"12a", 0, false}, {"-1", 0, false},
	} {
		if v, ok := ParseXid([]byte(c.in)); ok != c.ok || (ok && v != c.v) {
			t.Errorf("ParseXid(%q) = %d, %v", c.in, v, ok)
		}
	}
}

// TestReadCountsYoungRows: with OlderThan the chunk holds the same rows as without, and counts
// the rows last written by a transaction not older than it: the one updated row when OlderThan is
// its writer, none when it is the next xid.
func TestReadCountsYoungRows(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TABLE y (id int PRIMARY KEY, v text);
		INSERT INTO y SELECT g, 'v' || g FROM generate_series(1, 30) g`)
	ctx := context.Background()
	var inserter, updater uint32
	if err := pg.Pool().QueryRow(ctx, `SELECT xmin::text::bigint FROM y WHERE id = 1`).Scan(&inserter); err != nil {
		t.Fatal(err)
	}
	if err := pg.Pool().QueryRow(ctx, `UPDATE y SET v = 'new' WHERE id = 7 RETURNING xmin::text::bigint`).Scan(&updater); err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	cols := []Column{{Name: "id", SQLType: "integer"}, {Name: "v", SQLType: "text"}}
	spec := Spec{Schema: "public", Name: "y", Key: []string{"id"}, Columns: cols}
	plain, err := spec.Read(ctx, conn, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		olderThan uint32
		limit     int
		young     int
	}{
		{"the updater's xid", updater, 100, 1},
		{"the next xid", updater + 1, 100, 0},
		{"rows 1-6 only, the updater's xid", updater, 6, 0},
		{"the insert's xid", inserter, 100, 30},
	} {
		s := spec
		s.OlderThan = c.olderThan
		ch, err := s.Read(ctx, conn, nil, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := values(&ch.Rows), values(&plain.Rows); !reflect.DeepEqual(got, want[:min(c.limit, len(want))]) {
			t.Errorf("%s: rows with xmin differ: %q", c.name, got)
		}
		if !ch.XminRead || ch.Young != c.young {
			t.Errorf("%s: %d young rows (read %v), want %d", c.name, ch.Young, ch.XminRead, c.young)
		}
	}
	if plain.XminRead || plain.Young != 0 {
		t.Errorf("a read without OlderThan counted xmins")
	}
}

// values copies every row's values out of r.
func values(r *Rows) [][][]byte {
	var out [][][]byte
	for _, vals := range r.All() {
		row := make([][]byte, len(vals))
		for j, v := range vals {
			if v != nil {
				row[j] = append([]byte{}, v...)
			}
		}
		out = append(out, row)
	}
	return out
}

// TestRows appends rows of NULLs, empty values, values larger than a block and rows that fill a
// block, and reads each back whole, by row and by value, before and after the memory is reused.
func TestRows(t *testing.T) {
	big := bytes.Repeat([]byte("b"), valueBlock+10)
	fill := bytes.Repeat([]byte("f"), valueBlock-3)
	cases := []struct {
		name string
		rows [][][]byte
	}{
		{"none", nil},
		{"values, NULL and empty", [][][]byte{{[]byte("1"), nil, {}}, {[]byte("2"), []byte("x"), nil}}},
		{"every value NULL", [][][]byte{{nil, nil}, {nil, nil}}},
		{"larger than a block", [][][]byte{{[]byte("1"), big}, {[]byte("2"), []byte("after")}, {[]byte("3"), big}}},
		{"a row that fills a block, then one that does not fit", [][][]byte{{[]byte("1"), fill}, {[]byte("2"), []byte("abcd")}, {nil, {}}}},
		{"one column", [][][]byte{{[]byte("a")}, {{}}, {nil}}},
	}
	var r Rows
	for round := range 2 { // the second round reads into the first's memory
		for _, c := range cases {
			r.reuse()
			for _, row := range c.rows {
				r.Append(row)
			}
			if got := values(&r); !reflect.DeepEqual(got, c.rows) || r.Len() != len(c.rows) {
				t.Fatalf("round %d, %s: rows read back %.80q, want %.80q", round, c.name, got, c.rows)
			}
			size := 0
			for i, row := range c.rows {
				for j, v := range row {
					size += len(v)
					got := r.Value(i, j)
					if (got == nil) != (v == nil) || !bytes.Equal(got, v) {
						t.Fatalf("round %d, %s: Value(%d, %d) = %.20q, want %.20q", round, c.name, i, j, got, v)
					}
					if got != nil && cap(got) != len(got) {
						t.Fatalf("round %d, %s: Value(%d, %d) has room past its end", round, c.name, i, j)
					}
				}
			}
			if r.Size() != size {
				t.Fatalf("round %d, %s: Size %d, want %d", round, c.name, r.Size(), size)
			}
		}
	}
	r.Append([][]byte{big})
	r.reuse()
	for i, b := range append(r.blocks[:cap(r.blocks)], r.spare...) {
		if cap(b) > valueBlock {
			t.Errorf("block %d of a large row (%d bytes) kept for the next read", i, cap(b))
		}
	}
}
