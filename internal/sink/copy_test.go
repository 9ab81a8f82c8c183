package sink

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestBinaryFields: each COPY binary encoder writes the type's binary form for canonical values and
// refuses (the batch then goes as text) every value it cannot convert exactly as PostgreSQL would.
func TestBinaryFields(t *testing.T) {
	cases := []struct {
		oid  uint32
		in   string
		want string // hex of the length and the value; "" = refused
	}{
		{pgtype.Int2OID, "-32768", "00000002" + "8000"},
		{pgtype.Int2OID, "32767", "00000002" + "7fff"},
		{pgtype.Int2OID, "32768", ""},
		{pgtype.Int2OID, "+1", ""},
		{pgtype.Int2OID, " 1", ""},
		{pgtype.Int4OID, "007", "00000004" + "00000007"},
		{pgtype.Int4OID, "-1", "00000004" + "ffffffff"},
		{pgtype.Int4OID, "1.0", ""},
		{pgtype.Int4OID, "1e3", ""},
		{pgtype.Int4OID, "1_000", ""},
		{pgtype.Int4OID, "", ""},
		{pgtype.Int8OID, "9223372036854775807", "00000008" + "7fffffffffffffff"},
		{pgtype.Int8OID, "9223372036854775808", ""},
		{pgtype.Int8OID, "0x10", ""},
		{pgtype.Float8OID, "1.5", "00000008" + "3ff8000000000000"},
		{pgtype.Float8OID, "-0", "00000008" + "8000000000000000"},
		{pgtype.Float8OID, "0.0e5", "00000008" + "0000000000000000"},
		{pgtype.Float8OID, "1E-7", "00000008" + "3e7ad7f29abcaf48"},
		{pgtype.Float8OID, "5e-324", "00000008" + "0000000000000001"},
		{pgtype.Float8OID, "1e400", ""},
		{pgtype.Float8OID, "1e-400", ""},
		{pgtype.Float8OID, "NaN", ""},
		{pgtype.Float8OID, "Infinity", ""},
		{pgtype.Float8OID, "inf", ""},
		{pgtype.Float8OID, "0x1p-2", ""},
		{pgtype.Float8OID, ".5", ""},
		{pgtype.Float8OID, "1.", ""},
		{pgtype.Float8OID, "01", ""},
		{pgtype.Float8OID, "1_0", ""},
		{pgtype.Float8OID, " 1", ""},
		{pgtype.BoolOID, "true", "00000001" + "01"},
		{pgtype.BoolOID, "false", "00000001" + "00"},
		{pgtype.BoolOID, "t", ""},
		{pgtype.BoolOID, "1", ""},
		{pgtype.UUIDOID, "A0EEBC99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000010" + "a0eebc999c0b4ef8bb6d6bb9bd380a11"},
		{pgtype.UUIDOID, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", ""},
		{pgtype.UUIDOID, "a0eebc999c0b4ef8bb6d6bb9bd380a11", ""},
		{pgtype.UUIDOID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g", ""},
		{pgtype.TextOID, "a\tb", "00000003" + "610962"},
		{pgtype.VarcharOID, "", "00000000"},
		{pgtype.JSONOID, `{"a":1}`, "00000007" + hex.EncodeToString([]byte(`{"a":1}`))},
		{pgtype.JSONBOID, `[1]`, "00000004" + "01" + hex.EncodeToString([]byte(`[1]`))},
	}
	for _, c := range cases {
		enc := binFieldFor(c.oid)
		if enc == nil {
			t.Fatalf("no encoder for oid %d", c.oid)
		}
		out, ok := enc([]byte{0xee}, c.in)
		switch {
		case c.want == "" && ok:
			t.Errorf("oid %d %q: encoded %x, want it refused", c.oid, c.in, out[1:])
		case c.want != "" && !ok:
			t.Errorf("oid %d %q: refused, want %s", c.oid, c.in, c.want)
		case c.want != "" && hex.EncodeToString(out[1:]) != c.want:
			t.Errorf("oid %d %q: %x, want %s", c.oid, c.in, out[1:], c.want)
		case out[0] != 0xee:
			t.Errorf("oid %d %q: the bytes before the field changed", c.oid, c.in)
		}
	}
	for _, oid := range []uint32{pgtype.NumericOID, pgtype.TimestamptzOID, pgtype.DateOID, pgtype.Float4OID, pgtype.ByteaOID} {
		if binFieldFor(oid) != nil {
			t.Errorf("oid %d has a binary encoder; its values must go as text", oid)
		}
	}
}

// TestWriteFormats runs its subtests on one server.
func TestWriteFormats(t *testing.T) {
	f := startPG(t)
	t.Run("copy formats agree", func(t *testing.T) { copyFormatsAgree(t, f) })
	t.Run("fixed-length types", func(t *testing.T) { fixedLengthTypes(t, f) })
}

// copyFormatsAgree writes values of every type with a binary encoder through append mode and
// compares each stored value with PostgreSQL's own conversion of the text the sink reads from the
// payload (what the text format and INSERT store): canonical values (the streamed binary COPY),
// values only PostgreSQL's input functions read (the batch goes as text), NULLs, and bad values,
// each of which fails alone with PostgreSQL's SQLSTATE while the other shard's message commits.
func copyFormatsAgree(t *testing.T, f *pgFixture) {
	ctx := context.Background()
	f.exec(t, `CREATE DOMAIN posint AS int CHECK (VALUE > 0)`)
	type column struct {
		name, typ    string
		base         string   // typ without its typmod: the conversion casts to it, then assigns
		canon, other []string // JSON values: encoded in binary; read by PostgreSQL (text format)
		bad          []string // PostgreSQL refuses them
	}
	cols := []column{
		{"i2", "smallint", "smallint", []string{"0", "-32768", "32767", `"12"`, "null"}, []string{`" 7 "`, `"+5"`}, []string{"32768", "1.5", `"x"`}},
		{"i4", "int", "int", []string{"2147483647", "-2147483648", `"0042"`}, []string{`"+42"`}, []string{"2147483648", "1e3"}},
		{"i8", "bigint", "bigint", []string{"9223372036854775807", "-9223372036854775808"}, []string{`" 1 "`}, []string{"9223372036854775808", `"12abc"`}},
		{"f8", "float8", "float8", []string{"0", "-0", "1.5", "3.141592653589793", "1e-7", "2.2250738585072014e-308", "4.9e-324",
			"1.7976931348623157e308", "123456789012345678901234567890", `"-2.5E+3"`},
			[]string{`"NaN"`, `"Infinity"`, `"-Infinity"`, `" 1.5"`, `"1."`, `".5"`}, []string{"1e400", "1e-400", `"abc"`}},
		{"b", "bool", "bool", []string{"true", "false"}, []string{`"t"`, `"yes"`, "1"}, []string{`"maybe"`, "2"}},
		{"u", "uuid", "uuid", []string{`"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, `"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"`},
			[]string{`"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"`, `"a0eebc999c0b4ef8bb6d6bb9bd380a11"`},
			[]string{`"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g"`, `"zz"`}},
		{"t", "text", "text", []string{`"plain"`, `"tab\there\nnew\\back\r\\N"`, `"ünïcödé"`, `""`, "12", `{"a": [1]}`}, nil, []string{`"nul\u0000byte"`}},
		{"vc", "varchar(5)", "varchar", []string{`"abc"`, `"abcde"`, `"abcde   "`}, nil, []string{`"abcdef"`}},
		{"bc", "char(3)", "bpchar", []string{`"ab"`, `"abc"`}, nil, []string{`"abcd"`}},
		{"j", "json", "json", []string{`{"z":1,  "a":[true]}`, `"str"`, "1.50"}, nil, nil},
		{"jb", "jsonb", "jsonb", []string{`{"b":[1,2.50],"a":"x"}`, `[1, 2]`, `"s"`, "1.0e2"}, nil, nil},
		{"d", "posint", "posint", []string{"5"}, nil, []string{"-1"}},
	}
	var ddl []string
	for _, c := range cols {
		ddl = append(ddl, c.name+" "+c.typ)
	}
	table := f.name("formats")
	f.exec(t, `CREATE TABLE `+table+` (n int, `+strings.Join(ddl, ", ")+`)`)
	scratch := f.name("scratch")
	f.exec(t, `CREATE TABLE `+scratch+` (`+strings.Join(ddl, ", ")+`)`)
	a := f.applier(t, Config{Table: table, Mode: ModeAppend})
	tgt := a.Target()

	// expect is what PostgreSQL stores for the JSON value raw of column c (as text), or the SQLSTATE
	// with which it refuses it: the text cast to the type, then assigned to the column (typmod).
	expect := func(c column, raw string) (val string, code string) {
		col, _ := tgt.Column(c.name)
		v, err := valueFor(col, []byte(raw))
		if err != nil {
			t.Fatalf("%s %s: %v", c.name, raw, err)
		}
		if !v.Valid {
			return "<null>", ""
		}
		var s string
		err = f.pool.QueryRow(ctx, `INSERT INTO `+scratch+` (`+c.name+`) VALUES (($1::text)::`+c.base+`) RETURNING `+c.name+`::text`, v.String).Scan(&s)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return "", pgErr.Code
		} else if err != nil {
			t.Fatal(err)
		}
		return s, ""
	}
	off := int64(0)
	n := 0
	// rows writes a batch in which row k sets every column to its k-th value (cycling), so all rows
	// have one column set and the batch can stream; then it checks every stored value.
	rows := func(pick func(column) []string) {
		t.Helper()
		most := 0
		for _, c := range cols {
			most = max(most, len(pick(c)))
		}
		var msgs []*Message
		var wants []map[string]string
		for k := 0; k < most; k++ {
			n++
			members := []string{fmt.Sprintf(`"n":%d`, n)}
			want := map[string]string{}
			for _, c := range cols {
				vals := pick(c)
				if len(vals) == 0 {
					continue
				}
				raw := vals[k%len(vals)]
				members = append(members, fmt.Sprintf("%q:%s", c.name, raw))
				v, code := expect(c, raw)
				if code != "" {
					t.Fatalf("%s %s: PostgreSQL refuses it (%s), the case lists it as good", c.name, raw, code)
				}
				want[c.name] = v
			}
			off++
			msgs = append(msgs, msg("q", 0, off, "{"+strings.Join(members, ",")+"}"))
			wants = append(wants, want)
		}
		if res := write(t, a, msgs...); res.Applied != len(msgs) {
			t.Fatalf("applied %d of %d: %v", res.Applied, len(msgs), res.Errs)
		}
		for k, want := range wants {
			for name, v := range want {
				got := f.one(t, fmt.Sprintf(`SELECT coalesce(%s::text, '<null>') FROM %s WHERE n = %d`, name, table, n-len(wants)+1+k))
				if got != v {
					t.Errorf("%s: row %d stores %q, PostgreSQL's conversion of the same text is %q", name, k, got, v)
				}
			}
		}
	}
	rows(func(c column) []string { return c.canon })
	rows(func(c column) []string { return c.other })
	rows(func(c column) []string { return []string{"null"} })

	for _, c := range cols {
		for _, raw := range c.bad {
			_, code := expect(c, raw)
			if code == "" {
				t.Fatalf("%s %s: PostgreSQL accepts it, the case lists it as bad", c.name, raw)
			}
			n++
			off++
			bad := msg("q", 1, off, fmt.Sprintf(`{"n":%d,%q:%s}`, n, c.name, raw))
			n++
			good := msg("q", 2, off, fmt.Sprintf(`{"n":%d,%q:%s}`, n, c.name, c.canon[0]))
			res := write(t, a, bad, good)
			if res.Outcomes[0] != Failed || res.Outcomes[1] != Applied {
				t.Fatalf("%s %s: outcomes %v (%v), want failed then applied", c.name, raw, res.Outcomes, res.Errs)
			}
			if !strings.HasPrefix(res.Errs[0].Error(), code+": ") {
				t.Errorf("%s %s: error %q, want PostgreSQL's %s", c.name, raw, res.Errs[0], code)
			}
			if got := f.one(t, fmt.Sprintf(`SELECT count(*)::text FROM %s WHERE n IN (%d, %d)`, table, n-1, n)); got != "1" {
				t.Errorf("%s %s: %s rows of the bad and the good message, want only the good one", c.name, raw, got)
			}
		}
	}
}

// TestCopyStream: a batch streams while its rows keep the first row's column set and binary
// values; a row that does not (another column set, a value left to PostgreSQL, a payload that does
// not decode) sends the batch the grouped way, with every row written as before, and pauses
// streaming.
func TestCopyStream(t *testing.T) {
	w := newWriter(benchTarget(), MetadataColumns{})
	rows := benchRows(200, 1)
	msgs := make([]*Message, len(rows))
	pending := make([]int, len(rows))
	for i, r := range rows {
		msgs[i] = &Message{Queue: "q", Offset: int64(i + 1), HasPosition: true, Payload: r.payload}
		pending[i] = i
	}
	read := func(msgs []*Message, prefill int) (*copyStream, []byte, error) {
		s, ok := w.newCopyStream(msgs, pending[:len(msgs)])
		if !ok {
			t.Fatal("the first row does not stream")
		}
		s.prefill(prefill)
		var out []byte
		p := make([]byte, 1000)
		for {
			n, err := s.Read(p)
			out = append(out, p[:n]...)
			if err != nil {
				return s, out, err
			}
		}
	}
	s, data, err := read(msgs, 0)
	if !errors.Is(err, io.EOF) || !s.binary || s.stopped.Load() {
		t.Fatalf("stream of canonical rows: err %v, binary %v, stopped %v", err, s.binary, s.stopped.Load())
	}
	for _, chunks := range []int{1, 2, 100} {
		if _, pre, err := read(msgs, chunks); !errors.Is(err, io.EOF) || string(pre) != string(data) {
			t.Fatalf("with %d chunks encoded before the first read: err %v, the data differs: %v", chunks, err, string(pre) != string(data))
		}
	}
	ops := make([]op, len(msgs))
	for i, m := range msgs {
		if ops[i], err = (appendMode{w: w}).decode(m, nil); err != nil {
			t.Fatal(err)
		}
	}
	jobs, ok := appendMode{w: w}.copyPlan(ops)
	if !ok || len(jobs) != 1 || string(jobs[0].data) != string(data) || jobs[0].sql != s.sql || !strings.HasSuffix(s.sql, "(FORMAT binary)") {
		t.Fatalf("the stream's COPY differs from the grouped plan's: %q vs %q", s.sql, jobs[0].sql)
	}
	for name, payload := range map[string]string{
		"another column set":             `{"id":1,"name":"x"}`,
		"a value left to PostgreSQL":     `{"id":1,"name":"x","qty":" 1","version":1,"price":1,"status":"s","attrs":{}}`,
		"a payload that does not decode": `{"id":1,`,
	} {
		bad := append([]*Message(nil), msgs...)
		bad[150] = &Message{Queue: "q", Offset: 151, HasPosition: true, Payload: []byte(payload)}
		for _, chunks := range []int{0, 100} {
			s, _, err := read(bad, chunks)
			if !errors.Is(err, errStreamStopped) || !s.stopped.Load() {
				t.Errorf("%s, %d chunks before the first read: err %v, stopped %v", name, chunks, err, s.stopped.Load())
			}
		}
	}
	g := &streamGate{}
	g.pause()
	for i := 0; i < streamPause; i++ {
		if g.open() {
			t.Fatalf("open after %d batches of a pause of %d", i, streamPause)
		}
	}
	if !g.open() {
		t.Fatal("still paused after the pause")
	}
}

// fixedLengthTypes: character(n) and bit(n) values keep their length through every write path
// (the plain type names character and bit mean a length of 1 in a cast), and a value too long is
// refused with 22001.
func fixedLengthTypes(t *testing.T, f *pgFixture) {
	table := f.name("fixed")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, c char(3), b bit(3))`)
	for i, mode := range []Mode{ModeUpsert, ModeAppend, ModeCDC} {
		a := f.applier(t, Config{Table: table, Mode: mode})
		id := 10 * (i + 1)
		row := fmt.Sprintf(`{"id":%d,"c":"ab","b":"101"}`, id)
		long := fmt.Sprintf(`{"id":%d,"c":"abcd"}`, id+1)
		if mode == ModeCDC {
			row = `{"op":"c","after":` + row + `}`
			long = `{"op":"c","after":` + long + `}`
		}
		res := write(t, a, msg("q", 0, 1, row), msg("q", 1, 1, long))
		if res.Outcomes[0] != Applied || res.Outcomes[1] != Failed || !strings.HasPrefix(res.Errs[1].Error(), "22001: ") {
			t.Fatalf("%s: outcomes %v, errors %v", mode, res.Outcomes, res.Errs)
		}
		if got := f.one(t, fmt.Sprintf(`SELECT c::text || '/' || b::text FROM %s WHERE id = %d`, table, id)); got != "ab/101" {
			t.Errorf("%s: stored %q, want ab/101", mode, got)
		}
	}
}

// TestFastHeadAgreesWithSortOut: the fast paths' one-pass bookkeeping decides every message as
// sortOut does for a batch with no progress read and no decode errors (repeats and offsets going
// back inside a shard skipped, messages without a position applied), and the guard covers each
// shard's first pending offset and the update its last.
// Offsets start at 1: a batch with an offset below 1 never takes a fast path.
func TestFastHeadAgreesWithSortOut(t *testing.T) {
	prog, err := NewProgress("s", DefaultProgressTable)
	if err != nil {
		t.Fatal(err)
	}
	a := &Applier{progress: prog}
	rng := rand.New(rand.NewPCG(3, 5))
	for round := 0; round < 500; round++ {
		msgs := make([]*Message, 1+rng.IntN(40))
		for i := range msgs {
			msgs[i] = &Message{Queue: []string{"a", "b"}[rng.IntN(2)], Shard: int32(rng.IntN(3)), Offset: 1 + int64(rng.IntN(12)), HasPosition: rng.IntN(8) > 0}
		}
		want := newBatchState(len(msgs))
		wantPending := a.sortOut(msgs, make([]error, len(msgs)), nil, want)
		wantFirst := map[ShardKey]int64{}
		for _, i := range wantPending {
			want.applied(i, msgs[i])
			if _, ok := wantFirst[msgs[i].shardKey()]; msgs[i].HasPosition && !ok {
				wantFirst[msgs[i].shardKey()] = msgs[i].Offset
			}
		}
		got := newBatchState(len(msgs))
		pending, stmts, guard, shards := a.fastHead(msgs, got)
		if fmt.Sprint(pending) != fmt.Sprint(wantPending) || fmt.Sprint(got.res.Outcomes) != fmt.Sprint(want.res.Outcomes) ||
			fmt.Sprint(got.advanced) != fmt.Sprint(want.advanced) || len(shards) != len(wantFirst) {
			t.Fatalf("round %d: pending %v outcomes %v advanced %v shards %v; sortOut: %v %v %v %v",
				round, pending, got.res.Outcomes, got.advanced, shards, wantPending, want.res.Outcomes, want.advanced, wantFirst)
		}
		if len(wantFirst) == 0 {
			if guard != -1 {
				t.Fatalf("round %d: a guard without shards", round)
			}
			continue
		}
		queues, nums, _ := prog.sorted(shards)
		offs := stmts[guard].args[3].([]int64)
		for j := range queues {
			if k := (ShardKey{Queue: queues[j], Shard: nums[j]}); offs[j] != wantFirst[k] {
				t.Fatalf("round %d: guard offset of %v is %d, want %d", round, k, offs[j], wantFirst[k])
			}
		}
	}
}
